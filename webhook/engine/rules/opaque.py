"""`config/opaque`: opaque device configuration, checked as the driver serving the cluster checks it.

The driver is the one `webhook.dra.drivers.detect` finds (a setting, the inventory, the
DeviceClasses): the bundled driver's own validator (`driver.config.validate_opaque_config`, so
admission and prepare never disagree) or the port of NVIDIA's driver's rules
(`webhook.dra.drivers.nvidia`: GpuConfig, MigDeviceConfig, VfioDeviceConfig and the ComputeDomain
configs of `compute-domain.nvidia.com`).

Checks every `config[].opaque` whose `driver` is one that driver serves in ResourceClaims,
ResourceClaimTemplates and DeviceClasses: strict fields, allowed values, the 10 KiB size limit,
the retired `gpu.nvidia.com/v1alpha1` apiVersion, `requests` names that exist in the claim, and a
kind that fits every device type the named requests can be given (a GpuConfig on a MIG-only
request fails at prepare time). A config with no `requests` (and every DeviceClass config) only
applies to devices its kind fits, so there a misfit is reported only when it fits none of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..._driver import API_VERSION, ConfigError
from ...core.findings import Finding, Mode, Severity
from ...core.source import SourceObject
from ...dra.drivers import Detection, DriverSchema, detect, from_devices
from ...dra.objects import (
    ClaimSpec,
    OpaqueConfig,
    Selector,
    claim_spec_of,
    dra_version,
    read_device_class,
)
from ..quota import QuotaCalculator
from .base import DRA, FunctionRule, RuleContext

RULE_ID = "config/opaque"

_TYPE_TEST = re.compile(
    r"""\.type\s*==\s*['"](gpu|mig|vfio|channel|daemon)['"]"""
    r"""|\[['"]type['"]\]\s*==\s*['"](gpu|mig|vfio|channel|daemon)['"]"""
)
_MIG_HINT = re.compile(r"\bprofile\b|\bparentUUID\b|\bmigProfile\b")

_LAST: list[QuotaCalculator] = []
_DETECTED: list[tuple[object, str | None, Detection]] = []


def driver_schema(rc: RuleContext) -> Detection:
    """The driver schema this evaluation judges by (one detection per evaluation)."""
    setting = rc.ctx.driver_schema
    if _DETECTED and _DETECTED[0][0] is rc.index and _DETECTED[0][1] == setting:
        return _DETECTED[0][2]
    requested: set[str] = set()
    if not setting:
        for item in rc.objects:
            read = claim_spec_of(item.obj) if dra_version(item.obj.get("apiVersion")) else None
            if read is not None:
                requested.update(c for r in read[0].requests for c in r.device_classes() if c)
    # The devices' verdict is kept with the inventory: admission builds a new RuleContext per request.
    evidence = None if setting else rc.inventory.cached(
        ("driver-evidence",), lambda: from_devices(rc.inventory.devices))
    found = detect(setting, (), rc.index.classes, requested, evidence=evidence)
    _DETECTED[:] = [(rc.index, setting, found)]
    return found


def calculator(rc: RuleContext) -> QuotaCalculator:
    if _LAST and _LAST[0].inventory is rc.inventory and _LAST[0].classes is rc.index.classes:
        return _LAST[0]
    calc = QuotaCalculator(rc.inventory, rc.index.classes)
    _LAST[:] = [calc]
    return calc


def dotted(pointer: str) -> str:
    """`/spec/devices/config/0/opaque` -> `spec.devices.config[0].opaque`."""
    out = ""
    for tok in pointer.strip("/").split("/"):
        tok = tok.replace("~1", "/").replace("~0", "~")
        if tok.isdigit():
            out += f"[{tok}]"
        else:
            out += f".{tok}" if out else tok
    return out


def _types_from_text(class_name: str | None, selectors: Sequence[Selector]) -> set[str] | None:
    """Device types a selector pins by its text (`...type == 'mig'`, a MIG-only attribute)."""
    types: set[str] = set()
    for sel in selectors:
        for m in _TYPE_TEST.finditer(sel.expression):
            types.add(m.group(1) or m.group(2))
    if types:
        return types
    if any(_MIG_HINT.search(s.expression) for s in selectors):
        return {"mig"}
    if class_name and "vfio" in class_name.lower():
        return {"vfio"}
    if class_name and "mig" in class_name.lower():
        return {"mig"}
    return None


def device_types(
    rc: RuleContext, class_name: str | None, selectors: Sequence[Selector] = (),
    driver: str | None = None,
) -> set[str] | None:
    """Device types (`gpu`, `mig`, ...) a class plus request selectors can get; None when unknown.

    From the inventory when it has matching devices of `driver` (default: the schema's main
    driver), else from the selectors' text and the class name.
    """
    schema = driver_schema(rc).schema
    driver = driver or schema.driver_name
    calc = calculator(rc)
    cls = calc.class_spec(class_name) if class_name else None
    if class_name:
        devs = calc.matching(class_name, selectors)
        found = {
            str(d.attributes.get(d.driver, {}).get("type"))
            for d in devs or ()
            if d.driver == driver
        } & schema.device_types.get(driver, frozenset())
        if found:
            return found
    all_selectors = (*(cls.selectors if cls else ()), *selectors)
    return _types_from_text(class_name, all_selectors)


def _request_types(
    rc: RuleContext, spec: ClaimSpec, names: Sequence[str], driver: str | None = None
) -> tuple[set[str] | None, list[str]]:
    """(union of device types of the named requests or None if any is unknown, unknown names)."""
    union: set[str] = set()
    unknown_types = False
    missing: list[str] = []
    for ref in names:
        req_name, _, sub_name = ref.partition("/")
        req = spec.request(req_name)
        if req is None:
            missing.append(ref)
            continue
        if sub_name:
            subs = [s for s in req.first_available if s.name == sub_name]
            if not subs:
                missing.append(ref)
                continue
            alts = [(subs[0].device_class, subs[0].selectors)]
        else:
            alts = [(c, sel) for c, sel, *_ in req.alternatives()]
        for cls, sel in alts:
            t = device_types(rc, cls, sel, driver)
            if t is None:
                unknown_types = True
            else:
                union |= t
    return (None if unknown_types or not union else union), missing


def _fix_for(err: ConfigError, schema: DriverSchema) -> str:
    if err.path == "apiVersion":
        return f"set parameters.apiVersion: {API_VERSION}"
    if "unknown field" in err.message:
        return f"remove parameters.{err.path} ({schema.title} decodes strictly)"
    if err.path == "kind" and "cannot be applied" in err.message:
        return "use the kind the message names, or name only requests whose devices fit this kind"
    if not err.path:
        return "shrink the parameters below 10 KiB or split the config per request"
    return f"correct parameters.{err.path} as the message says"


def _config_findings(
    item: SourceObject, rc: RuleContext, cfg: OpaqueConfig, spec: ClaimSpec | None,
    class_types: set[str] | None, schema: DriverSchema,
) -> Iterable[Finding]:
    where = dotted(cfg.pointer)
    driver = cfg.driver or schema.driver_name
    types: set[str] | None = None
    if spec is not None and cfg.requests:
        types, missing = _request_types(rc, spec, cfg.requests, cfg.driver)
        if missing:
            known = sorted({r.name for r in spec.requests} | {
                f"{r.name}/{s.name}" for r in spec.requests for s in r.first_available})
            entry = cfg.pointer.rsplit("/", 1)[0]
            yield rc.finding(
                item, RULE_ID, Severity.ERROR, Mode.ENFORCE,
                f"{dotted(entry)}.requests: {', '.join(missing)} not in this claim (requests here: "
                f"{', '.join(known) or 'none'})",
                fix="name requests of this claim (`<request>` or `<request>/<subrequest>`), "
                    "or drop `requests` to apply the config to all of them",
                pointer=f"{entry}/requests",
            )
    errors = schema.validate(driver, cfg.parameters, types)
    for err in errors:
        field = f"{where}.parameters" + (f".{err.path}" if err.path else "")
        yield rc.finding(
            item, RULE_ID, Severity.ERROR, Mode.ENFORCE, f"{field}: {err.message}",
            fix=_fix_for(err, schema),
            pointer=f"{cfg.pointer}/parameters" + ("/" + err.path.replace(".", "/") if err.path else ""),
        )
    if errors or (spec is not None and cfg.requests):
        return
    # No `requests` (or a class config): the driver only applies it to devices its kind fits.
    candidates = class_types
    if candidates is None and spec is not None:
        candidates, _ = _request_types(rc, spec, [r.name for r in spec.requests], cfg.driver)
    kind = cfg.parameters.get("kind")
    kinds = schema.config_kinds.get(driver, {})
    if candidates and isinstance(kind, str) and kind in kinds and not kinds[kind] & candidates:
        fitting = sorted({k for t in candidates if (k := schema.kind_for(driver, t))})
        yield rc.finding(
            item, RULE_ID, Severity.WARNING, Mode.WARN,
            f"{where}: {kind} applies to none of the devices this can be given (device types: "
            f"{', '.join(sorted(candidates))}), so the driver ignores it",
            fix=f"use {' or '.join(fitting)} for these devices" if fitting
            else f"drop the config: {schema.title} has no config kind for these devices",
            pointer=cfg.pointer,
        )


def _check(item: SourceObject, rc: RuleContext) -> Iterable[Finding]:
    obj = item.obj
    if dra_version(obj.get("apiVersion")) is None:
        return
    if obj.get("kind") == "DeviceClass":
        dc = read_device_class(obj)
        schema = driver_schema(rc).schema
        for cfg in dc.config:
            if cfg.driver in schema.drivers:
                class_types = device_types(rc, dc.name, (), cfg.driver) if dc.name else None
                yield from _config_findings(item, rc, cfg, None, class_types, schema)
        return
    read = claim_spec_of(obj)
    if read is None:
        return
    spec = read[0]
    schema = driver_schema(rc).schema
    for cfg in spec.config:
        if cfg.driver in schema.drivers:
            yield from _config_findings(item, rc, cfg, spec, None, schema)


RULES = (FunctionRule(RULE_ID, _check, frozenset({DRA})),)
