"""`quota/<policy>`: GPU budgets per namespace or team, per DeviceClass, in GPU-equivalents and claims.

Static: one object alone over a budget (a Deployment counts replicas x devices per pod, a Job its
parallelism). Live (admission, `ctx.usage` from the server's claim cache): what is in use plus
this object's demand must stay within the budget. Live checks skip UPDATEs: a claim's spec is
immutable and a workload's existing pods are already in the usage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from ...core.findings import Finding, Mode, Severity
from ...core.source import SourceObject
from ...dra.objects import DeviceClassSpec, as_map, claim_spec_of
from ...dra.workloads import effective_amounts, pod_templates_of
from ...policy.model import GpuQuotaPolicy, glob_match
from ..context import QuotaUsage
from ..migration import is_legacy_resource, mig_profile_of, node_labels_of
from ..quota import (
    QuotaCalculator,
    add_ratio,
    budget_applies,
    inventory_calculator,
    mig_fraction,
)
from .base import DRA_CLAIM, WORKLOAD, FunctionRule, RuleContext, severity_for

RULE_PREFIX = "quota/"
IMPLICIT_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
_EPSILON = 1e-9


@dataclass
class Demand:
    """What one object would consume: devices per class, GPU-equivalents, ResourceClaim objects."""

    devices: dict[str, int] = field(default_factory=dict)
    # An int while every term is whole (the usual case), a Fraction otherwise: the same value.
    gpu_equivalents: Fraction | int = 0
    claims: int = 0
    pods: int = 1
    pointer: str = ""
    # Human-readable origin per class, e.g. "6 pods x 1 (template mig-inference-template)".
    origin: dict[str, list[str]] = field(default_factory=dict)
    # Requests whose GPU-equivalents are only a lower bound (an `All` request with its devices
    # unknown): the findings say so instead of charging an invented number.
    unknown: list[str] = field(default_factory=list)

    def add(self, cls: str, n: int, why: str) -> None:
        self.devices[cls] = self.devices.get(cls, 0) + n
        self.origin.setdefault(cls, []).append(why)


# The last evaluation's calculator: class matches are computed once per evaluation, not per object.
# Inventories and indexes are immutable, and holding them keeps their identity from being reused.
_LAST: list[QuotaCalculator] = []


def _calculator(rc: RuleContext) -> QuotaCalculator:
    if _LAST and _LAST[0].inventory is rc.inventory and _LAST[0].classes is rc.index.classes:
        return _LAST[0]
    inv_classes = rc.inventory.classes
    if rc.index.classes is inv_classes or (len(rc.index.classes) == len(inv_classes) and all(
        inv_classes.get(name) == spec for name, spec in rc.index.classes.items()
    )):
        # The input set brings no class of its own (the admission case: one workload per request):
        # share one calculator per inventory, so class matches are not recomputed per request.
        return inventory_calculator(rc.inventory)
    calc = QuotaCalculator(rc.inventory, rc.index.classes)
    _LAST[:] = [calc]
    return calc


def _extended_classes(classes: Mapping[str, DeviceClassSpec]) -> dict[str, str]:
    """Extended resource -> the first class (by name) serving it through DRA."""
    serving: dict[str, list[str]] = {}
    for c in classes.values():
        if c.extended_resource_name is not None:
            serving.setdefault(c.extended_resource_name, []).append(c.name)
    return {res: min(names) for res, names in serving.items()}


def _extended_class(rc: RuleContext, resource: str) -> str | None:
    """The DeviceClass that serves an extended resource through DRA (KEP-5004), if any."""
    if resource.startswith(IMPLICIT_CLASS_PREFIX):
        return resource[len(IMPLICIT_CLASS_PREFIX):] or None
    classes = rc.index.classes
    if classes is rc.inventory.classes:  # a workload's review: the cluster's classes, memoized with them
        table = rc.inventory.cached(("quota", "extended-classes"), lambda: _extended_classes(classes))
    else:  # classes in the input set: this evaluation's own
        table = _extended_classes(classes)
    return table.get(resource)


def demand_of(item: SourceObject, rc: RuleContext) -> Demand | None:
    """The demand of a ResourceClaim or a workload; None for objects that consume nothing."""
    calc = _calculator(rc)
    obj = item.obj
    read = claim_spec_of(obj)
    if read is not None:
        if obj.get("kind") != "ResourceClaim":
            return None  # a template consumes nothing until a pod uses it
        spec, ptr = read
        d = Demand(claims=1, pointer=f"{ptr}/devices/requests")
        for cls, n in calc.claim_demand(spec).items():
            d.add(cls, n, f"{n} (claim)")
        d.gpu_equivalents = calc.claim_gpu_equivalents(spec)
        d.unknown = calc.unknown_charges(spec)
        return d
    templates = pod_templates_of(obj)
    if not templates:
        return None
    spec_map = as_map(obj.get("spec"))
    d = Demand(pointer="/spec/replicas" if "replicas" in spec_map else templates[0].pointer)
    claims = rc.pod_claims(item)
    # GPU-equivalents as numerator / denominator ints (see QuotaCalculator.claim_gpu_ratio).
    ge_n, ge_d = 0, 1
    total_pods = 0
    for tmpl in templates:
        pods = tmpl.replicas
        if obj.get("kind") == "DaemonSet":
            # One pod per node: count the GPU nodes the inventory knows (1 without an inventory).
            pods = max(len(rc.inventory.nodes()), 1)
        total_pods += pods
        unit = "pod" if pods == 1 else "pods"
        where = "" if len(templates) == 1 else f" in {tmpl.pointer}"
        for pc in claims:
            if not pc.pointer.startswith(f"{tmpl.pointer}/resourceClaims/"):
                continue
            if pc.kind != "template" or pc.spec is None:
                # A shared ResourceClaim is charged once, as its own object; an inline `source` spec
                # is dropped by the API server (structure/inline-source reports it).
                continue
            d.claims += pods
            for cls, n in calc.claim_demand(pc.spec).items():
                d.add(cls, n * pods, f"{pods} {unit} x {n} (template {pc.target}){where}")
            n, den = calc.claim_gpu_ratio(pc.spec)
            ge_n, ge_d = add_ratio(ge_n, ge_d, n * pods, den)
            d.unknown.extend(f"{u} (template {pc.target}, {pods} {unit})"
                             for u in calc.unknown_charges(pc.spec))
        extended = False
        # Effective amounts (max of init containers vs sum of app containers), as the scheduler and
        # the device plugin count them: an init container's GPUs are reused by the app containers.
        for res, count in sorted(effective_amounts(tmpl.spec).items()):
            ext_cls = _extended_class(rc, res)
            if ext_cls is not None:
                extended = True
                d.add(ext_cls, count * pods, f"{pods} {unit} x {count} ({res}){where}")
                frac = calc.class_fraction(ext_cls)
                ge_n, ge_d = add_ratio(ge_n, ge_d, frac.numerator * count * pods, frac.denominator)
            elif is_legacy_resource(res):
                cls, frac = _legacy_class(rc, res, tmpl.spec, calc)
                d.add(cls, count * pods, f"{pods} {unit} x {count} ({res}, device plugin){where}")
                ge_n, ge_d = add_ratio(ge_n, ge_d, frac.numerator * count * pods, frac.denominator)
        if extended:
            d.claims += pods  # the scheduler creates one claim per pod for extended resources
    d.pods = total_pods
    # The same value as before: an int while it is whole, a Fraction otherwise.
    d.gpu_equivalents = ge_n // ge_d if ge_n % ge_d == 0 else Fraction(ge_n, ge_d)
    return d


def _legacy_class(rc: RuleContext, resource: str, podspec: Mapping[str, Any],
                  calc: QuotaCalculator) -> tuple[str, Fraction]:
    """The DeviceClass a device-plugin resource is charged to, and GPU-equivalents per device.

    The class is the one the MigrationPolicy maps it to (what its migration would ask for), so a
    workload costs the same budget before and after it migrates; unmapped, the resource name itself.
    """
    labels = node_labels_of(podspec)
    for pol in rc.policies.migration:
        m = pol.mapping_for(resource, labels)
        if m is not None:
            profile = mig_profile_of(resource)
            frac = mig_fraction(profile, m.device_class) if profile else None
            return m.device_class, frac if frac is not None else calc.class_fraction(m.device_class)
    profile = mig_profile_of(resource)
    frac = mig_fraction(profile) if profile else None
    return resource, frac if frac is not None else Fraction(1)


_applies = budget_applies


def _used(usage: QuotaUsage, scope: str, pattern: str) -> int:
    return sum(n for (s, cls), n in usage.devices.items() if s == scope and glob_match(pattern, cls))


def _fmt(x: float | Fraction | int) -> str:
    return f"{float(x):.2f}".rstrip("0").rstrip(".")


def _check(item: SourceObject, rc: RuleContext) -> Iterable[Finding]:
    if not rc.policies.quota:
        return
    demand = demand_of(item, rc)
    if demand is None or (not demand.devices and not demand.claims):
        return
    namespace = rc.namespace(item) or rc.ctx.default_namespace
    labels = rc.namespace_labels(namespace)
    usage = rc.ctx.usage if rc.ctx.operation != "UPDATE" else None
    live = usage is not None
    for pol in rc.policies.quota:
        for b in pol.budgets:
            scope = _applies(b, pol, namespace, labels)
            if scope is None:
                continue
            for pattern, limit in b.device_classes.items():
                want = sum(n for c, n in demand.devices.items() if glob_match(pattern, c))
                if want == 0:
                    continue
                used = _used(usage, scope, pattern) if usage is not None else 0
                excess = _excess(want, used, limit, live)
                if excess is None:
                    continue

                def origin(pattern: str = pattern) -> str:
                    shown = (c for c in demand.devices if glob_match(pattern, c))
                    return "; ".join(f"{c}: {', '.join(demand.origin[c])}" for c in shown)

                yield _over(excess, item, rc, pol, _where(scope), f"devices of class {pattern}", want,
                            used, limit, origin, demand)
            if b.gpu_equivalents is not None and demand.gpu_equivalents > 0:
                used_ge = usage.gpu_equivalents.get(scope, 0.0) if usage is not None else 0.0
                excess = _excess(demand.gpu_equivalents, used_ge, b.gpu_equivalents, live)
                if excess is not None:
                    def ge_origin() -> str:
                        calc = _calculator(rc)
                        devices = sorted(demand.devices.items())
                        text = ", ".join(f"{n} x {c} at {calc.class_fraction(c)}" for c, n in devices)
                        if demand.unknown:
                            text += "; at least: " + "; ".join(demand.unknown)
                        return text

                    yield _over(excess, item, rc, pol, _where(scope), "GPU-equivalents",
                                demand.gpu_equivalents, used_ge, b.gpu_equivalents, ge_origin, demand)
                elif demand.unknown:
                    yield _partial(item, rc, pol, _where(scope), demand, b.gpu_equivalents)
            if b.claims is not None and demand.claims > 0:
                used_c = usage.claims.get(scope, 0) if usage is not None else 0
                excess = _excess(demand.claims, used_c, b.claims, live)
                if excess is not None:
                    yield _over(excess, item, rc, pol, _where(scope), "ResourceClaims", demand.claims, used_c,
                                b.claims, lambda: f"{demand.pods} pod(s)", demand)


def _where(scope: str) -> str:
    """How a finding names a usage scope (written only into findings)."""
    return f"{'team' if scope.startswith('team:') else 'namespace'} {scope.removeprefix('team:')}"


Excess = Literal["alone", "with-usage"]


def _excess(want: float | Fraction | int, used: float, limit: float, live: bool) -> Excess | None:
    """How `want` breaks the budget: "alone" when it is over the limit by itself, "with-usage" when
    it is over with what is in use (live usage only), None when within (most demands; deciding
    that first spares the closures that word a finding)."""
    w = float(want)
    if w > limit + _EPSILON:
        return "alone"
    if live and w + used > limit + _EPSILON:
        return "with-usage"
    return None


def _over(
    excess: Excess, item: SourceObject, rc: RuleContext, pol: GpuQuotaPolicy, where: str, what: str,
    want: float | Fraction | int, used: float, limit: float, origin_of: Callable[[], str], demand: Demand,
) -> Finding:
    mode = pol.mode
    origin = origin_of()  # only written into a finding
    if excess == "alone":
        return rc.finding(
            item, f"{RULE_PREFIX}{pol.name}", severity_for(mode), mode,
            f"asks for {_fmt(want)} {what} ({origin}) but the budget of {where} in GpuQuotaPolicy "
            f"{pol.name} is {_fmt(limit)}",
            fix=_fix(item, demand, what, limit, pol),
            pointer=demand.pointer,
        )
    return rc.finding(
        item, f"{RULE_PREFIX}{pol.name}", severity_for(mode), mode,
        f"would bring {where} to {_fmt(float(want) + used)} {what} (in use {_fmt(used)} + this "
        f"{_fmt(want)}: {origin}); the budget in GpuQuotaPolicy {pol.name} is {_fmt(limit)}",
        fix=f"free {_fmt(float(want) + used - limit)} {what} in {where} first, or raise the budget",
        pointer=demand.pointer,
    )


def _partial(item: SourceObject, rc: RuleContext, pol: GpuQuotaPolicy, where: str, demand: Demand,
             limit: float) -> Finding:
    """Within the budget as far as review can count, but part of the charge is unknown: recorded
    (audit), never a denial on a number draguard would have to invent."""
    return rc.finding(
        item, f"{RULE_PREFIX}{pol.name}", Severity.INFO, Mode.AUDIT,
        f"counted {_fmt(demand.gpu_equivalents)} GPU-equivalent(s) against the budget of {where} in "
        f"GpuQuotaPolicy {pol.name} ({_fmt(limit)}), a lower bound: {'; '.join(demand.unknown)}",
        fix="count its devices against an inventory that has them (`draguard review --inventory`, the "
            "cluster's ResourceSlices at admission), or ask for an exact count",
        pointer=demand.pointer,
    )


def _fix(item: SourceObject, demand: Demand, what: str, limit: float, pol: GpuQuotaPolicy) -> str:
    if demand.pods > 1:
        return (
            f"lower the replica count/parallelism ({demand.pods} now) or the devices per pod so the total "
            f"stays within {_fmt(limit)} {what}, or raise the budget in GpuQuotaPolicy {pol.name}"
        )
    return f"request at most {_fmt(limit)} {what}, or raise the budget in GpuQuotaPolicy {pol.name}"


RULES = (FunctionRule(RULE_PREFIX, _check, frozenset({DRA_CLAIM, WORKLOAD})),)
