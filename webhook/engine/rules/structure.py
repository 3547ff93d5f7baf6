"""`structure/*`: claims and pod specs the API server rejects, drops, or can never allocate.

Modes are fixed per check (PolicyException scopes them out): what the API server would reject is
enforce; what admits but misbehaves (never allocates, unused claims, old versions) is warn.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import yaml

from ...core.findings import Finding, Mode, Severity
from ...core.source import SourceObject
from ...dra.device import Device
from ...dra.drivers import NVIDIA_CLASS_NAMES, DriverSchema, installed_class
from ...dra.objects import (
    ALL,
    DRA_KINDS,
    VERSIONS,
    ClaimSpec,
    DeviceRequest,
    Selector,
    as_list,
    as_map,
    as_str,
    claim_problems,
    claim_spec_of,
    claim_template,
    dra_version,
    read_claim_spec,
    split_api_version,
    write_claim_spec,
)
from ...dra.workloads import pod_spec_of, pod_templates_of
from ..migration import hosted_forms
from ..quota import pinned_drivers
from ..resolve import claim_refs, per_node_capacity
from .base import CLAIM_KIND, DRA_CLAIM, DRA_GROUP, WORKLOAD, FunctionRule, RuleContext
from .opaque import calculator, driver_schema

ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
DRIVER_DOMAIN = "gpu.nvidia.com"
# Attributes that say "these devices are wired together" (what a multi-GPU job should constrain on).
INTERCONNECT_ATTRIBUTES: frozenset[str] = frozenset(
    {"gpu.nvidia.com/nvlinkDomain", "resource.kubernetes.io/pcieRoot", "gpu.nvidia.com/cliqueID"}
)
PREFERRED_INTERCONNECT = "gpu.nvidia.com/nvlinkDomain"
_FM_PARTITION = re.compile(r"gpu\.nvidia\.com/partition[0-9]+")


def _dump(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False).rstrip()


def _claim_objects(item: SourceObject) -> tuple[ClaimSpec, str] | None:
    return claim_spec_of(item.obj)


def newest_served(served: frozenset[str]) -> str | None:
    """The most stable resource.k8s.io version the cluster serves (v1 > v1beta2 > v1beta1)."""
    return next((v for v in VERSIONS if v in served), None)


# -- structure/inline-source -------------------------------------------------------------------


def check_inline_source(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    found = pod_spec_of(item.obj)
    if found is None:
        return
    pp, spec = found
    claims = as_list(spec.get("resourceClaims"))
    if not any("source" in as_map(raw) for raw in claims):
        return  # the usual case: nothing in the pre-1.31 form
    ns = rc.namespace(item)
    meta_name = as_str(as_map(item.obj.get("metadata")).get("name")) or "workload"
    version = newest_served(rc.ctx.served_versions) or "v1"
    api_version = f"resource.k8s.io/{version}"
    for i, raw in enumerate(claims):
        entry = as_map(raw)
        if "source" not in entry:
            continue
        p = f"{pp}/resourceClaims/{i}"
        name = as_str(entry.get("name")) or f"claim-{i}"
        source = as_map(entry.get("source"))
        ref_t = as_str(source.get("resourceClaimTemplateName"))
        ref_c = as_str(source.get("resourceClaimName"))
        generated: tuple[dict[str, Any], ...] = ()
        if ref_t or ref_c:
            field, value = ("resourceClaimTemplateName", ref_t) if ref_t else ("resourceClaimName", ref_c)
            rewrite = {"name": name, field: value}
            fix = f"move the name out of `source` (removed in Kubernetes 1.31):\n{_dump([rewrite])}"
        else:
            inline = read_claim_spec(source, "resource.k8s.io/v1beta1", f"{p}/source")
            tmpl_name = f"{meta_name}-{name}"[:253]
            tmpl = claim_template(tmpl_name, ns, inline, api_version)
            generated = (tmpl,)
            rewrite = {"name": name, "resourceClaimTemplateName": tmpl_name}
            fix = (
                "an inline claim spec under `source` was never part of the Pod API, and `source` itself is "
                "gone since Kubernetes 1.31; create this ResourceClaimTemplate:\n"
                f"{_dump(tmpl)}\nand reference it from the pod:\n{_dump([rewrite])}"
            )
        yield rc.finding(
            item,
            "structure/inline-source",
            Severity.ERROR,
            Mode.ENFORCE,
            f"resourceClaims[{i}] ({name!r}) uses the pre-1.31 `source` form; the API server drops `source` "
            "and the pod gets no device (or is rejected for naming neither a claim nor a template)",
            fix=fix,
            pointer=f"{p}/source",
            generated=generated,
        )


# -- structure/undeclared-claim ----------------------------------------------------------------


def check_undeclared_claim(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    found = pod_spec_of(item.obj)
    if found is None:
        return
    pp, spec = found
    declared: dict[str, str] = {}
    for i, raw in enumerate(as_list(spec.get("resourceClaims"))):
        n = as_str(as_map(raw).get("name"))
        if n is not None:
            declared.setdefault(n, f"{pp}/resourceClaims/{i}")
    refs = claim_refs(spec, pp)
    # KServe's one-container forms (`predictor.model`, `predictor.pytorch`, ...) run in this pod too.
    for fptr, container in hosted_forms(item.obj, pod_templates_of(item.obj)).get(pp, ()):
        refs += [(n, fptr + ptr.removeprefix(f"{pp}/containers/0"), ref)
                 for n, ptr, ref in claim_refs({"containers": [container]}, pp)]  # fmt: skip
    used = [(n, ptr) for n, ptr, _ref in refs]
    used_names = {n for n, _ in used}
    for n, ptr in used:
        if n not in declared:
            decl = ", ".join(sorted(declared)) or "none"
            yield rc.finding(
                item,
                "structure/undeclared-claim",
                Severity.ERROR,
                Mode.ENFORCE,
                f"container claim {n!r} is not declared in spec.resourceClaims (declared: {decl}); "
                "the API server rejects the pod",
                fix=f"add `- name: {n}` with resourceClaimTemplateName or resourceClaimName to "
                "spec.resourceClaims, or fix the container's claim name",
                pointer=ptr,
            )
    resolved = {pc.name: pc for pc in rc.pod_claims(item)}
    for n, ptr, ref in refs:
        pc = resolved.get(n)
        if pc is None or pc.spec is None:
            continue
        req = as_str(as_map(ref).get("request"))
        if not req:
            continue
        if pc.spec.request(req.split("/", 1)[0]) is None:
            names = ", ".join(r.name for r in pc.spec.requests) or "none"
            yield rc.finding(
                item,
                "structure/undeclared-claim",
                Severity.WARNING,
                Mode.WARN,
                f"container claim {n!r} names request {req!r}, which claim {pc.target or n!r} does not have "
                f"(requests: {names}); the container will not start",
                fix=f"set `request` to one of: {names}, or drop it to get the whole claim",
                pointer=ptr,
            )
    for n, ptr in declared.items():
        if n not in used_names:
            yield rc.finding(
                item,
                "structure/undeclared-claim",
                Severity.WARNING,
                Mode.WARN,
                f"spec.resourceClaims entry {n!r} is used by no container; its devices are allocated "
                "but no container can reach them",
                fix=f"add `resources: {{claims: [{{name: {n}}}]}}` to the container that needs it, "
                "or remove the entry",
                pointer=ptr,
            )


# -- structure/deprecated-version --------------------------------------------------------------


def check_deprecated_version(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    obj = item.obj
    version = dra_version(obj.get("apiVersion"))
    served = rc.ctx.served_versions
    best = newest_served(served)
    if version is None:
        yield from _retired_version(item, rc, best)
        return
    if best is None or VERSIONS.index(version) <= VERSIONS.index(best):
        return
    target = f"resource.k8s.io/{best}"
    kind = str(obj.get("kind"))
    fix = f"change apiVersion to {target}"
    read = claim_spec_of(obj)
    if read is not None and (version == "v1beta1") != (best == "v1beta1"):
        fix += (
            "; requests change shape: deviceClassName/selectors/count/allocationMode/adminAccess "
            "move under `exactly`"
        )
        spec = read[0]
        if spec.requests:
            fix += f":\n{_dump(write_claim_spec(ClaimSpec(requests=spec.requests[:1]), target))}"
    elif kind == "ResourceSlice" and version == "v1beta1":
        fix += "; device fields move out of the `basic` wrapper onto each devices[] entry"
    if version not in served:
        severity, mode = Severity.ERROR, Mode.ENFORCE
        msg = f"{kind} uses {obj.get('apiVersion')}, which this cluster does not serve (it serves {target})"
    else:
        severity, mode = Severity.WARNING, Mode.WARN
        msg = (
            f"{kind} uses {obj.get('apiVersion')}; the cluster serves {target}, and beta versions are "
            "off by default from Kubernetes 1.34 and will be removed"
        )
    yield rc.finding(
        item, "structure/deprecated-version", severity, mode, msg, fix=fix, pointer="/apiVersion"
    )


def _retired_version(item: SourceObject, rc: RuleContext, best: str | None) -> Iterator[Finding]:
    """resource.k8s.io/v1alpha2 / v1alpha3 claims and classes: what older guides show, gone today."""
    group, version = split_api_version(item.obj.get("apiVersion"))
    kind = item.obj.get("kind")
    if group != "resource.k8s.io" or not isinstance(kind, str) or kind not in DRA_KINDS:
        return
    target = f"resource.k8s.io/{best or 'v1'}"
    yield rc.finding(
        item,
        "structure/deprecated-version",
        Severity.ERROR,
        Mode.ENFORCE,
        f"{kind} uses resource.k8s.io/{version}, which no supported Kubernetes release serves for {kind} "
        "(v1alpha2 was removed in 1.31; v1alpha3 holds only DeviceTaintRule since 1.34)",
        fix=(
            f"change apiVersion to {target}; claims list device requests "
            "(`requests: [{name, exactly: {deviceClassName, count, selectors}}]` in v1/v1beta2); a v1alpha2 "
            "resourceClassName/parametersRef claim must be rewritten as such a request"
        ),
        pointer="/apiVersion",
    )


# -- structure/unsatisfiable -------------------------------------------------------------------


def _match(expressions: Sequence[str], devices: Sequence[Device]) -> list[Device] | None:
    """Matching devices, or None when the CEL runtime gave up (cel/limits reports it)."""
    from ...cel.match import match_devices  # CEL runtime loads on first use

    result = match_devices(expressions, devices)
    return None if result.undecided else list(result.matched)


def _request_alternatives(req: DeviceRequest) -> list[tuple[str | None, tuple[Selector, ...], str, int, str]]:
    return list(req.alternatives())


def check_unsatisfiable(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    inv = rc.inventory
    if inv.is_empty:
        return
    read = _claim_objects(item)
    if read is None:
        return
    spec, spec_pointer = read
    published = inv.published_attributes()
    alone_fits = True
    for req in spec.requests:
        reasons: list[str] = []
        for dc, selectors, mode, count, _ptr in _request_alternatives(req):
            if dc is None:
                continue
            cls = rc.index.classes.get(dc)
            if cls is None:
                if inv.classes:
                    reasons.append(f"DeviceClass {dc} does not exist")
                    continue
                reasons.append("")  # class unknown offline: cannot judge, treat as satisfiable
                break
            exprs = [s.expression for s in (*cls.selectors, *selectors)]
            try:
                matched = inv.cached(("match", tuple(exprs)), partial(_match, exprs, inv.devices))
            except ValueError:  # does not compile: cel/syntax reports it, no capacity verdict here
                reasons.append("")
                break
            if matched is None:  # evaluation beyond the runtime's budget: no verdict either
                reasons.append("")
                break
            group_by = [
                c.match_attribute
                for c in spec.constraints
                if c.match_attribute
                and (not c.requests or req.name in {r.split("/", 1)[0] for r in c.requests})
                and tuple(c.match_attribute.rpartition("/")[::2]) in published
            ]
            best, node = inv.cached(
                ("capacity", tuple(exprs), tuple(group_by)), partial(per_node_capacity, matched, group_by)
            )
            need = 1 if mode == ALL else count
            if need <= best:
                reasons.append("")
                break
            grouped = f" sharing the same {', '.join(group_by)}" if group_by else ""
            reasons.append(
                f"{dc}: needs {need} device(s) on one node{grouped}, the most any node has is {best}"
                + (f" ({node})" if node else "")
                + f"; {len(matched)} matching device(s) in total"
            )
        if not reasons or "" in reasons:
            continue
        alone_fits = False
        yield rc.finding(
            item,
            "structure/unsatisfiable",
            Severity.WARNING,
            Mode.WARN,
            f"request {req.name!r} can never be allocated with the current inventory: " + "; ".join(reasons),
            fix="lower `count`, split the work across pods, relax the selectors/constraints, "
            "or add nodes with enough matching devices",
            pointer=req.pointer,
        )
    # What the API server rejects is structure/invalid's to report, not a verdict on allocation.
    if alone_fits and spec.requests and not claim_problems(item.obj):
        yield from _unsatisfiable_together(item, rc, spec, spec_pointer)


# Device tries per claim for structure/unsatisfiable (tens of microseconds each).
RULE_MAX_STEPS = 5_000


def _unsatisfiable_together(
    item: SourceObject, rc: RuleContext, spec: ClaimSpec, pointer: str
) -> Iterator[Finding]:
    """Every request fits on some node alone: judge the claim as a whole (counters, taints,
    capacity, constraints across requests, devices other claims hold, node selection)."""
    from ..allocate import allocate

    published = rc.inventory.published_attributes()
    for c in spec.constraints:
        attr = c.match_attribute or c.distinct_attribute
        if attr and tuple(attr.rpartition("/")[::2]) not in published:
            return  # a constraint on a name no device publishes is structure/interconnect's to report
    name = as_str(as_map(item.obj.get("metadata")).get("name"))
    ns = rc.namespace(item) or rc.ctx.default_namespace
    key = (ns, name) if item.obj.get("kind") == "ResourceClaim" and name else None
    # On the request path a hostile claim must not buy seconds of search: a smaller bound, past
    # which there is no verdict (and no finding); `draguard explain` searches further.
    verdict = allocate(
        spec, rc.inventory, rc.index.classes, claim_key=key, every_node=False, max_steps=RULE_MAX_STEPS
    )
    if verdict.allocatable is not False:
        return
    yield rc.finding(
        item,
        "structure/unsatisfiable",
        Severity.WARNING,
        Mode.WARN,
        "the claim cannot be allocated as a whole with the current inventory, though each request "
        "fits alone: " + "; ".join(verdict.reasons),
        fix="add tolerations for the taints named, lower capacity requests or counts, relax the "
        "constraints, or free the devices other claims hold; `draguard explain` shows each request",
        pointer=f"{pointer}/devices",
    )


# -- structure/interconnect --------------------------------------------------------------------


def _is_partition_class(name: str | None, rc: RuleContext) -> bool:
    """MIG and other partition classes never join an NVLink group: interconnect does not apply."""
    if name is None:
        return False
    if "mig" in name.lower():
        return True
    cls = rc.index.classes.get(name)
    return cls is not None and any("mig" in s.expression.lower() for s in cls.selectors)


def _class_drivers(name: str, rc: RuleContext) -> frozenset[str] | None:
    """The drivers a DeviceClass's devices come from, as far as review can see; None when it cannot.

    From the class's selectors (a file, the cluster, or what a known driver's installation creates),
    else from the inventory's devices it matches, else from the names NVIDIA's chart and draguard's
    bundle give their classes (`gpu.nvidia.com`, `gpu.nvidia.com-h100`, `mig.nvidia.com`)."""
    cls = rc.index.classes.get(name) or rc.inventory.classes.get(name)
    installed = installed_class(name) if cls is None else None
    exprs = [s.expression for s in cls.selectors] if cls is not None else [installed] if installed else []
    pins = pinned_drivers(exprs)
    if pins:
        return pins
    if cls is not None:
        devices = calculator(rc).matching(name)
        if devices:
            return frozenset(d.driver for d in devices)
        if any(DRIVER_DOMAIN in e for e in exprs):
            return frozenset({DRIVER_DOMAIN})  # selects on NVIDIA's attributes
    if name in NVIDIA_CLASS_NAMES or name.startswith(DRIVER_DOMAIN):
        return frozenset({DRIVER_DOMAIN})
    return None


def _nvlink_applies(name: str | None, rc: RuleContext) -> bool:
    """NVLink advice is for NVIDIA GPUs: not for another driver's devices, nor for a class review
    cannot see (it does not guess what such a class holds)."""
    drivers = _class_drivers(name, rc) if name else None
    return drivers is not None and DRIVER_DOMAIN in drivers


def _known_attribute(attr: str, published: frozenset[tuple[str, str]], schema: DriverSchema) -> bool:
    dom, _, name = attr.rpartition("/")
    if published:
        return (dom, name) in published
    if dom in schema.domains:
        return schema.lookup(dom, name, "attribute") is not None
    return True  # a third-party domain offline: nothing to check against


def _preferred_interconnect(schema: DriverSchema, count: int = 0) -> str:
    """The attribute joining NVLink-connected GPUs in the driver serving the cluster: draguard's
    `nvlinkDomain`, or NVIDIA's Fabric Manager partition of `count` GPUs (NVSwitch systems)."""
    if schema.lookup(DRIVER_DOMAIN, "nvlinkDomain", "attribute") is not None:
        return PREFERRED_INTERCONNECT
    size = next((n for n in (2, 4, 8) if n >= count), 8)
    return f"{DRIVER_DOMAIN}/partition{size}"


def _is_interconnect(attr: str) -> bool:
    # NVIDIA's Fabric Manager partitions: GPUs sharing partitionN are joined through NVSwitch.
    return attr in INTERCONNECT_ATTRIBUTES or _FM_PARTITION.fullmatch(attr) is not None


def _suggest_attribute(attr: str, published: frozenset[tuple[str, str]], schema: DriverSchema) -> str:
    name = attr.rpartition("/")[2]
    if "nvlink" in name.lower() or "interconnect" in name.lower() or "link" in name.lower():
        return _preferred_interconnect(schema)
    if published:
        candidates = [f"{d}/{n}" for d, n in published]
    else:
        candidates = [f"{s.domain}/{s.name}" for s in schema.attributes if s.kind == "attribute"
                      and not s.is_pattern]
    close = difflib.get_close_matches(attr, candidates, n=1, cutoff=0.5)
    return close[0] if close else _preferred_interconnect(schema)


def check_interconnect(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    read = _claim_objects(item)
    if read is None:
        return
    spec, _ = read
    published = rc.inventory.published_attributes()
    schema = driver_schema(rc).schema
    good_constraint: set[str] = set()
    for c in spec.constraints:
        attr = c.match_attribute
        if attr is None:
            continue
        if "/" not in attr:
            yield rc.finding(
                item,
                "structure/interconnect",
                Severity.ERROR,
                Mode.ENFORCE,
                f"constraint matchAttribute {attr!r} has no domain; the API server rejects it",
                fix=f"write the fully qualified name, e.g. {DRIVER_DOMAIN}/{attr}",
                pointer=f"{c.pointer}/matchAttribute",
            )
            continue
        if not _known_attribute(attr, published, schema):
            where = (
                "is published by no device in the inventory"
                if published
                else f"is not an attribute of the {DRIVER_DOMAIN} driver schema ({schema.title})"
            )
            suggestion = _suggest_attribute(attr, published, schema)
            yield rc.finding(
                item,
                "structure/interconnect",
                Severity.ERROR,
                Mode.ENFORCE,
                f"constraint matchAttribute {attr!r} {where}; devices without it never "
                "satisfy the constraint, so the claim stays pending forever",
                fix=f"constrain on {suggestion!r} (matchAttribute: {suggestion})",
                pointer=f"{c.pointer}/matchAttribute",
            )
            continue
        if _is_interconnect(attr):
            for r in spec.covers(c.requests):
                good_constraint.add(r.name)
    for req in spec.requests:
        if req.name in good_constraint or req.allocation_mode == ALL:
            continue
        alts = [a for a in req.alternatives()
                if a[3] >= 2 and not _is_partition_class(a[0], rc) and _nvlink_applies(a[0], rc)]
        if not alts:
            continue
        # A bad-attribute constraint on this request was already reported above.
        if any(
            c.match_attribute and not _known_attribute(c.match_attribute, published, schema)
            for c in spec.constraints
            if req in spec.covers(c.requests)
        ):
            continue
        count = max(a[3] for a in alts)
        yield rc.finding(
            item,
            "structure/interconnect",
            Severity.WARNING,
            Mode.WARN,
            f"request {req.name!r} asks for {count} GPUs without a matchAttribute constraint on an "
            "interconnect attribute; the scheduler may pick GPUs that are not joined by NVLink",
            fix=(
                "add to spec.devices.constraints:\n"
                + _dump([{"requests": [req.name], "matchAttribute": _preferred_interconnect(schema, count)}])
            ),
            pointer=req.pointer,
        )


# -- structure/admin-access --------------------------------------------------------------------


def _admin_requests(item: SourceObject) -> list[DeviceRequest]:
    read = claim_spec_of(item.obj)
    if read is None:
        return []
    return [r for r in read[0].requests if r.admin_access]


def check_admin_access(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    reqs = _admin_requests(item)
    if not reqs:
        return
    ns = rc.namespace(item) or rc.ctx.default_namespace
    labels = rc.namespace_labels(ns)
    if labels is not None and labels.get(ADMIN_ACCESS_LABEL) == "true":
        # Allowed, and worth a record: admin access reaches devices already in use by other pods
        # (monitoring, debugging), so the audit lists every such claim for whoever owns the cluster.
        for r in reqs:
            yield rc.finding(
                item,
                "structure/admin-access",
                Severity.INFO,
                Mode.AUDIT,
                f"request {r.name!r} sets adminAccess to devices of class {r.device_class!r}: it can reach "
                f"devices other pods are using (namespace {ns!r} is labelled {ADMIN_ACCESS_LABEL})",
                fix="nothing to fix if this is a monitoring or debugging tool; otherwise remove adminAccess",
                pointer=f"{r.pointer}/adminAccess",
            )
        return
    fix = (
        "remove adminAccess, or (cluster admins only) "
        f"`kubectl label namespace {ns} {ADMIN_ACCESS_LABEL}=true`"
    )
    for r in reqs:
        if labels is None:
            yield rc.finding(
                item,
                "structure/admin-access",
                Severity.WARNING,
                Mode.WARN,
                f"request {r.name!r} sets adminAccess; namespace {ns!r} must carry the label "
                f'{ADMIN_ACCESS_LABEL}: "true" (its labels are not known here)',
                fix=fix,
                pointer=f"{r.pointer}/adminAccess",
            )
        else:
            yield rc.finding(
                item,
                "structure/admin-access",
                Severity.ERROR,
                Mode.ENFORCE,
                f"request {r.name!r} sets adminAccess, but namespace {ns!r} lacks the label "
                f'{ADMIN_ACCESS_LABEL}: "true"; the API server rejects the claim',
                fix=fix,
                pointer=f"{r.pointer}/adminAccess",
            )


# -- structure/invalid -------------------------------------------------------------------------


def check_invalid(item: SourceObject, rc: RuleContext) -> Iterator[Finding]:
    """A claim or template the API server rejects (validation or kubectl's strict field check)."""
    for p in claim_problems(item.obj):
        yield rc.finding(
            item,
            "structure/invalid",
            Severity.ERROR,
            Mode.ENFORCE,
            f"the API server rejects this {item.obj.get('kind')}: {p.field}: {p.message}",
            fix=f"correct {p.field} ({item.obj.get('apiVersion')})",
            pointer=p.pointer,
        )


RULES = (
    FunctionRule("structure/invalid", check_invalid, frozenset({CLAIM_KIND})),
    FunctionRule("structure/inline-source", check_inline_source, frozenset({WORKLOAD})),
    FunctionRule("structure/undeclared-claim", check_undeclared_claim, frozenset({WORKLOAD})),
    FunctionRule("structure/deprecated-version", check_deprecated_version, frozenset({DRA_GROUP})),
    FunctionRule("structure/unsatisfiable", check_unsatisfiable, frozenset({DRA_CLAIM})),
    FunctionRule("structure/interconnect", check_interconnect, frozenset({DRA_CLAIM})),
    FunctionRule("structure/admin-access", check_admin_access, frozenset({DRA_CLAIM})),
)
