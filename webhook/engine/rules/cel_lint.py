"""`cel/*`: lint every CEL selector in DeviceClasses, ResourceClaims and ResourceClaimTemplates.

Each selector (class selectors, request selectors, `firstAvailable` subrequest selectors) goes
through `webhook.cel.lint.lint_selector` against the inventory; every issue becomes a finding whose
rule id is the issue's check. The CelLintPolicy covering the object's namespace decides which
checks run and in which mode; without one, every check runs in warn mode. At admission the
API server has already compiled and cost-checked the selector, so `cel/syntax`, `cel/type`,
`cel/limits` and `cel/version` (for the target release, `Context.kubernetes_version`) are
reported only by offline review.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from ..._driver import DRIVER_NAME
from ...cel.lint import lint_selector
from ...core.findings import Finding, Mode, Severity
from ...core.source import SourceObject
from ...dra.device import Device
from ...dra.drivers import installed_class
from ...dra.objects import Selector, claim_spec_of, dra_version, read_device_class
from ...policy.model import CelLintPolicy
from .base import DRA, FunctionRule, RuleContext
from .opaque import calculator, dotted, driver_schema

DEFAULT_POLICY = CelLintPolicy(name="default", mode=Mode.WARN)

API_SERVER_CHECKS = frozenset({"cel/syntax", "cel/type", "cel/limits", "cel/version"})
"""Checks that predict the API server's own create-time validation: offline review only."""

def _policy_for(rc: RuleContext, namespace: str | None) -> CelLintPolicy:
    pols = rc.policies.cel_lint
    if not pols:
        return DEFAULT_POLICY
    if namespace is None:
        # Cluster-scoped (DeviceClass): the policies not limited to some namespaces.
        for p in pols:
            if not p.scope.namespaces and not p.scope.match_labels:
                return p
        return pols[0]
    labels = rc.namespace_labels(namespace)
    for p in pols:
        if p.scope.applies(namespace, labels):
            return p
    return DEFAULT_POLICY


def _severity(name: str | None, default: Severity) -> Severity:
    try:
        return Severity(name) if name else default
    except ValueError:
        return default


def _line(item: SourceObject, sel: Selector, issue_line: int | None) -> int | None:
    """Line of the issue in the file: the `expression:` key's line plus the offset inside the text.

    A multi-line expression is a literal block scalar whose first line follows the key.
    """
    base = item.line_of(sel.pointer)
    if base is None or not issue_line:
        return base
    if "\n" in sel.expression:
        return base + issue_line
    return base


def _issues(
    rc: RuleContext, expression: str, devices: Sequence[Device] | None, scope: tuple[str, ...] = ()
) -> Any:
    # `devices` is the whole inventory, the devices a class with selectors `scope` selects, or None:
    # the same selector text (one DeviceClass named by many claims) lints the same way, so its
    # issues are computed once per inventory.
    version = rc.ctx.kubernetes_version
    known = driver_schema(rc).schema
    return rc.inventory.cached(
        ("cel-lint", expression, devices is not None, version, known.name, scope),
        partial(lint_selector, expression, devices=devices, driver=DRIVER_NAME, kubernetes_version=version,
                known=known),
    )


_BROKEN = frozenset({"cel/syntax", "cel/type", "cel/limits"})
# For a request naming a class that does not exist, its selectors' matches and guard mean nothing.
_UNKNOWN_CLASS_SKIPS = frozenset({"cel/driver-guard", "cel/no-match"})


def _class_guards_driver(rc: RuleContext, class_name: str | None, devices: Sequence[Device] | None) -> bool:
    """Whether the class's own selectors pin `device.driver`. The scheduler evaluates a request's
    selectors only on devices the class selected, so such a class guards every request naming it."""
    cls = rc.index.classes.get(class_name or "") or rc.inventory.classes.get(class_name or "")
    if cls is None:
        # A class a driver's installation creates (NVIDIA's chart's `gpu.nvidia.com`): its selector
        # is known even when no file defines it.
        installed = installed_class(class_name or "")
        return installed is not None and "cel/driver-guard" not in {
            i.check for i in _issues(rc, installed, devices)}
    for sel in cls.selectors:
        checks = {i.check for i in _issues(rc, sel.expression, devices)}
        if "cel/driver-guard" not in checks and not checks & _BROKEN:
            return True
    return False


def _class_devices(rc: RuleContext, class_name: str | None) -> tuple[tuple[str, ...], list[Device]] | None:
    """(the class's selectors, the devices it selects), or None when the class is unknown, has no
    selectors or selects nothing. The scheduler runs a request's selectors only on its class's
    devices, so a lookup that fails on other devices (another type, NVIDIA's IMEX channels beside
    its GPUs) is no error."""
    calc = calculator(rc)
    cls = calc.class_spec(class_name) if class_name else None
    if cls is None or class_name is None or not cls.selectors:
        return None
    devices = calc.matching(class_name)
    return (tuple(s.expression for s in cls.selectors), devices) if devices else None


def _lint(
    item: SourceObject, rc: RuleContext, policy: CelLintPolicy, selectors: Sequence[Selector],
    devices: Sequence[Device] | None, skip: frozenset[str] = frozenset(),
    scoped: tuple[tuple[str, ...], list[Device]] | None = None,
) -> Iterable[Finding]:
    for sel in selectors:
        issues = _issues(rc, sel.expression, devices)
        if scoped is not None:
            # Evaluation failures on the class's devices only; whether anything matches stays a
            # question about the whole inventory (structure/unsatisfiable judges class + request).
            issues = [
                *(i for i in _issues(rc, sel.expression, scoped[1], scoped[0]) if i.check != "cel/no-match"),
                *(i for i in issues if i.check == "cel/no-match"),
            ]
        for issue in issues:
            if issue.check in skip:
                continue
            if rc.ctx.admission and issue.check in API_SERVER_CHECKS:
                # The API server validated this selector before calling the webhook: a compile,
                # type or cost finding here is draguard disagreeing with it, never a reason to deny.
                continue
            setting = policy.setting(issue.check)
            if setting is None:
                continue
            mode = setting.mode or policy.mode
            if issue.check == "cel/unsupported" and issue.check not in policy.checks:
                # The API server accepts these selectors: only an explicit setting may deny them.
                mode = Mode.WARN if mode is Mode.ENFORCE else mode
            base = rc.finding(
                item, issue.check, _severity(setting.severity, issue.severity), mode,
                f"{dotted(sel.pointer)}: {issue.message}", fix=issue.fix, pointer=sel.pointer,
            )
            line = _line(item, sel, issue.line)
            yield base if line == base.line else _with_line(base, line)


def _with_line(f: Finding, line: int | None) -> Finding:
    return dataclasses.replace(f, line=line)


def _check(item: SourceObject, rc: RuleContext) -> Iterable[Finding]:
    obj = item.obj
    if dra_version(obj.get("apiVersion")) is None:
        return
    all_devices: Sequence[Device] | None = rc.inventory.devices or None
    if obj.get("kind") == "DeviceClass":
        dc = read_device_class(obj)
        yield from _lint(item, rc, _policy_for(rc, None), dc.selectors, all_devices)
        return
    read = claim_spec_of(obj)
    if read is None:
        return
    policy = _policy_for(rc, rc.namespace(item))
    for req in read[0].requests:
        for cls, selectors, _mode, _count, _ptr in req.alternatives():
            # Matched against the whole inventory: whether class and request selectors together
            # leave any device is structure/unsatisfiable's question (it also names an unknown class,
            # once). The driver guard belongs to the class when the class has one.
            skip: frozenset[str] = frozenset()
            known = bool(cls) and (cls in rc.index.classes or cls in rc.inventory.classes)
            if cls and not known and (rc.inventory.classes or rc.index.classes):
                skip = _UNKNOWN_CLASS_SKIPS  # structure/unsatisfiable says the class does not exist
            elif cls and not known and installed_class(cls) is None:
                # A class review cannot see (no file, no inventory, no known driver installs it):
                # whether it pins device.driver is unknown, so no guard advice is given for it.
                skip = frozenset({"cel/driver-guard"})
            elif selectors and _class_guards_driver(rc, cls, all_devices):
                skip = frozenset({"cel/driver-guard"})
            scoped = _class_devices(rc, cls) if selectors and all_devices else None
            yield from _lint(item, rc, policy, selectors, all_devices, skip, scoped)


RULES = (FunctionRule("cel/", _check, frozenset({DRA})),)
