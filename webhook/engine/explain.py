"""Why a claim would (or would not) get devices: class, matching devices per node, and the blockers.

Pure: objects + inventory in, explanations out. `draguard explain` renders them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.findings import ObjectRef
from ..core.source import SourceObject
from ..dra.device import Device
from ..dra.inventory import Inventory
from ..dra.objects import ALL, ClaimSpec, DeviceRequest, as_map, as_str, claim_problems, claim_spec_of
from .allocate import Verdict, allocate, describe_picks
from .resolve import (
    IMPLICIT_CLASS_PREFIX,
    ExtendedRequest,
    Index,
    extended_claims,
    extended_requests,
    namespace_of,
    per_node_capacity,
    pod_claims,
)


@dataclass(frozen=True, slots=True)
class NodeMatch:
    node: str | None  # None: devices not bound to one node
    product: str
    count: int

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "product": self.product, "count": self.count}


@dataclass(frozen=True, slots=True)
class Alternative:
    """One way to satisfy a request (the request itself, or one firstAvailable subrequest)."""

    name: str
    device_class: str | None
    class_found: bool
    selectors: tuple[str, ...]
    allocation_mode: str
    count: int
    matched: int = 0
    by_node: tuple[NodeMatch, ...] = ()
    per_node_max: int = 0
    satisfiable: bool | None = None  # None: cannot tell (no inventory)
    reasons: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "deviceClass": self.device_class,
            "classFound": self.class_found,
            "selectors": list(self.selectors),
            "allocationMode": self.allocation_mode,
            "count": self.count,
            "matched": self.matched,
            "byNode": [m.to_json() for m in self.by_node],
            "perNodeMax": self.per_node_max,
            "satisfiable": self.satisfiable,
            "reasons": list(self.reasons),
            "errors": list(self.errors),
        }


@dataclass(frozen=True, slots=True)
class Explanation:
    object: ObjectRef
    file: str | None
    line: int | None
    claim: str  # pod claim name, or the claim/template object's name
    source: str  # "ResourceClaimTemplate x", "ResourceClaim y", "inline source", "unresolved ..."
    request: str | None
    alternatives: tuple[Alternative, ...] = ()
    constraints: tuple[str, ...] = ()
    satisfiable: bool | None = None
    reasons: tuple[str, ...] = field(default_factory=tuple)
    # The claim judged as a whole (webhook/engine/allocate.py): where it fits and what it gets there.
    nodes: tuple[str | None, ...] = ()
    picks: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "object": self.object.to_json(),
            "file": self.file,
            "line": self.line,
            "claim": self.claim,
            "source": self.source,
            "request": self.request,
            "constraints": list(self.constraints),
            "satisfiable": self.satisfiable,
            "reasons": list(self.reasons),
            "alternatives": [a.to_json() for a in self.alternatives],
            "nodes": list(self.nodes),
            "devices": list(self.picks),
            "notes": list(self.notes),
        }

    def render(self) -> str:
        """Human text, a few lines per request."""
        where = f"{self.file}:{self.line} " if self.file else ""
        verdict = {
            True: "can be allocated",
            False: "CANNOT be allocated",
            None: "cannot be decided offline" if self.reasons else "not checked (no inventory)",
        }[self.satisfiable]
        head = f"{where}{self.object} claim {self.claim!r} ({self.source})"
        if self.request is None:
            return "\n".join([head, *(f"  - {r}" for r in self.reasons)])
        lines = [f"{head} request {self.request!r}: {verdict}"]
        for c in self.constraints:
            lines.append(f"  constraint: {c}")
        for a in self.alternatives:
            label = f"{a.name}: " if a.name != self.request else ""
            lines.append(
                f"  {label}class {a.device_class or '-'}"
                + ("" if a.class_found else " (not found)")
                + f", {a.allocation_mode} {a.count if a.allocation_mode != ALL else 'all'}"
                + f", {a.matched} matching device(s), at most {a.per_node_max} on one node"
            )
            for m in a.by_node:
                lines.append(f"    {m.node or '(any node)'}: {m.count} x {m.product}")
            for r in a.reasons:
                lines.append(f"    why not: {r}")
            for e in a.errors:
                lines.append(f"    selector error: {e}")
        if self.satisfiable and self.nodes:
            lines.append("  fits on: " + ", ".join(n or "(any node)" for n in self.nodes))
            lines.extend(f"  device: {p}" for p in self.picks)
        lines.extend(f"  why not: {r}" for r in self.reasons)
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _product(d: Device) -> str:
    attrs = d.attributes.get(d.driver, {})
    name = attrs.get("productName")
    prof = attrs.get("profile")
    text = str(name) if name is not None else d.driver
    return f"{text} MIG {prof}" if prof is not None else text


def _group(devices: Sequence[Device]) -> tuple[NodeMatch, ...]:
    counts: dict[tuple[str | None, str], int] = {}
    for d in devices:
        k = (d.node, _product(d))
        counts[k] = counts.get(k, 0) + 1
    return tuple(
        NodeMatch(n, p, c) for (n, p), c in sorted(counts.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))
    )


def _explain_alternative(
    name: str,
    device_class: str | None,
    selectors: Sequence[str],
    mode: str,
    count: int,
    group_by: Sequence[str],
    index: Index,
    inventory: Inventory,
) -> Alternative:
    cls = index.classes.get(device_class) if device_class else None
    base = Alternative(name, device_class, cls is not None, tuple(selectors), mode, count)
    if inventory.is_empty:
        return base
    if cls is None:
        reason = (
            f"DeviceClass {device_class} does not exist"
            if device_class
            else "the request names no DeviceClass"
        )
        return Alternative(
            name, device_class, False, tuple(selectors), mode, count, satisfiable=False, reasons=(reason,)
        )
    from ..cel.match import match_devices  # the CEL runtime loads on first use

    exprs = [s.expression for s in cls.selectors] + list(selectors)
    try:
        result = match_devices(exprs, inventory.devices)
    except ValueError as e:  # an expression that does not compile
        return Alternative(
            name,
            device_class,
            True,
            tuple(selectors),
            mode,
            count,
            satisfiable=False,
            reasons=(f"a selector does not compile: {e}",),
        )
    matched = list(result.matched)
    best, node = per_node_capacity(matched, group_by)
    need = 1 if mode == ALL else count
    reasons: list[str] = []
    if not matched:
        reasons.append("the class and request selectors match no device in the inventory")
    elif need > best:
        grouped = f" sharing the same {', '.join(group_by)}" if group_by else ""
        reasons.append(
            f"needs {need} device(s) on one node{grouped}; the most any node offers is {best}"
            + (f" ({node})" if node else "")
        )
    errors = tuple(f"{e.message} ({e.devices} device(s))" for e in result.errors)
    return Alternative(
        name,
        device_class,
        True,
        tuple(selectors),
        mode,
        count,
        len(matched),
        _group(matched),
        best,
        not reasons,
        tuple(reasons),
        errors,
    )


def explain_request(
    req: DeviceRequest, spec: ClaimSpec, index: Index, inventory: Inventory
) -> tuple[tuple[Alternative, ...], tuple[str, ...], bool | None, tuple[str, ...]]:
    published = inventory.published_attributes()
    constraints: list[str] = []
    group_by: list[str] = []
    reasons: list[str] = []
    for c in spec.constraints:
        if not c.match_attribute or req not in spec.covers(c.requests):
            continue
        constraints.append(f"matchAttribute {c.match_attribute}")
        dom, _, attr = c.match_attribute.rpartition("/")
        if not inventory.is_empty and (dom, attr) not in published:
            reasons.append(f"constraint attribute {c.match_attribute} is published by no device")
        else:
            group_by.append(c.match_attribute)
    alts = tuple(
        _explain_alternative(
            f"{req.name}/{req.first_available[i].name}" if req.first_available else req.name,
            dc,
            [s.expression for s in sels],
            mode,
            count,
            group_by,
            index,
            inventory,
        )
        for i, (dc, sels, mode, count, _p) in enumerate(req.alternatives())
    )
    if inventory.is_empty:
        return alts, tuple(constraints), None, tuple(reasons)
    ok = not reasons and any(a.satisfiable for a in alts)
    return alts, tuple(constraints), ok, tuple(reasons)


def _ref(obj: Mapping[str, Any], default_namespace: str) -> ObjectRef:
    meta = as_map(obj.get("metadata"))
    return ObjectRef(
        as_str(obj.get("apiVersion")) or "",
        as_str(obj.get("kind")) or "",
        namespace_of(obj, default_namespace),
        as_str(meta.get("name")) or "<unnamed>",
    )


def _rejected(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """Why the API server would reject this claim or template, one line per field."""
    return tuple(f"the API server rejects this {obj.get('kind')}: {p.field}: {p.message}"
                 for p in claim_problems(obj))  # fmt: skip


def _whole(
    ok: bool | None, reasons: tuple[str, ...], verdict: Verdict | None
) -> tuple[bool | None, tuple[str, ...], dict[str, Any]]:
    """A request's verdict with the whole claim's: a request that fits alone still fails with it."""
    if verdict is None:
        return ok, reasons, {}
    extra: dict[str, Any] = {"notes": verdict.notes}
    if verdict.allocatable is True:
        extra["nodes"] = verdict.nodes
        extra["picks"] = tuple(describe_picks(verdict.picks))
    if ok is False:
        return ok, reasons, extra
    if verdict.allocatable is False:
        return False, (*reasons, *verdict.reasons), extra
    if verdict.allocatable is None and ok:
        return None, (*reasons, *verdict.reasons), extra
    return ok, reasons, extra


def explain(
    objects: Sequence[SourceObject], inventory: Inventory, default_namespace: str = "default"
) -> list[Explanation]:
    """One Explanation per request of every claim, template and workload in `objects`."""
    index = Index.build(objects, inventory, default_namespace)
    out: list[Explanation] = []
    for item in objects:
        obj = item.obj
        if not isinstance(obj, Mapping):
            continue
        ref = _ref(obj, default_namespace)
        read = claim_spec_of(obj)
        if read is not None:
            spec = read[0]
            rejected = _rejected(obj)
            key = (ref.namespace or default_namespace, ref.name) if ref.kind == "ResourceClaim" else None
            verdict = (
                None
                if inventory.is_empty
                else allocate(spec, inventory, index.classes, claim_key=key, classes_complete=True)
            )
            for req in spec.requests:
                alts, cons, ok, reasons = explain_request(req, spec, index, inventory)
                ok, reasons, whole = _whole(ok, reasons, verdict)
                if rejected:
                    # Never "can be allocated": the object would not even be created.
                    ok, reasons = False, (*rejected, *reasons)
                out.append(
                    Explanation(
                        ref,
                        item.file,
                        item.line_of(req.pointer),
                        ref.name,
                        ref.kind,
                        req.name,
                        alts,
                        cons,
                        ok,
                        reasons,
                        **whole,
                    )
                )
            continue
        ns = ref.namespace or default_namespace
        for pc in pod_claims(obj, index, ns):
            line = item.line_of(pc.pointer)
            if pc.spec is None:
                what = {"template": "ResourceClaimTemplate", "claim": "ResourceClaim"}.get(pc.kind, "claim")
                reason = (
                    f"{what} {ns}/{pc.target} is in neither the input nor the inventory"
                    if pc.target
                    else "the entry names neither resourceClaimName nor resourceClaimTemplateName"
                )
                out.append(
                    Explanation(
                        ref, item.file, line, pc.name, f"unresolved {what}", None, (), (), False, (reason,)
                    )
                )
                continue
            source = (
                "inline source"
                if pc.kind == "inline"
                else (f"{'ResourceClaimTemplate' if pc.kind == 'template' else 'ResourceClaim'} {pc.target}")
            )
            rejected = _rejected(pc.source.obj) if pc.source is not None else ()
            key = (ns, pc.target) if pc.kind == "claim" and pc.target else None
            verdict = (
                None
                if inventory.is_empty
                else allocate(pc.spec, inventory, index.classes, claim_key=key, classes_complete=True)
            )
            for req in pc.spec.requests:
                alts, cons, ok, reasons = explain_request(req, pc.spec, index, inventory)
                ok, reasons, whole = _whole(ok, reasons, verdict)
                if rejected:
                    ok, reasons = False, (*rejected, *reasons)
                out.append(
                    Explanation(
                        ref, item.file, line, pc.name, source, req.name, alts, cons, ok, reasons, **whole
                    )
                )
        out.extend(_extended(item, ref, index, inventory))
    return out


def _extended(item: SourceObject, ref: ObjectRef, index: Index, inventory: Inventory) -> list[Explanation]:
    """KEP-5004: a pod's extended resources that a DeviceClass serves (`deviceclass.resource.kubernetes.io/
    <class>`, or a name a class declares as its `extendedResourceName`) become one claim the scheduler
    makes for the pod, a request of the pod's effective count per class. Explained like any claim."""
    found = extended_requests(item.obj, index.classes)
    if not found:
        return []
    per_class = extended_claims(item.obj, index.classes)
    first: dict[str, ExtendedRequest] = {}
    for r in found:
        first.setdefault(r.device_class, r)
    requests = tuple(
        DeviceRequest(name=first[cls].resource, device_class=cls, count=n, pointer=first[cls].pointer)
        for cls, n in sorted(per_class.items())
        if n > 0 and cls in first
    )
    spec = ClaimSpec(requests=requests)
    verdict = None if inventory.is_empty else allocate(spec, inventory, index.classes, classes_complete=True)
    out: list[Explanation] = []
    for req in requests:
        r = first[req.device_class or ""]
        alts, cons, ok, reasons = explain_request(req, spec, index, inventory)
        ok, reasons, whole = _whole(ok, reasons, verdict)
        implicit = r.resource.startswith(IMPLICIT_CLASS_PREFIX)
        served = "" if implicit else f", the extendedResourceName of {r.device_class}"
        out.append(Explanation(
            ref, item.file, item.line_of(r.pointer), r.resource,
            f"extended resource (KEP-5004: a claim the scheduler makes for the pod{served})",
            r.resource, alts, cons, ok, reasons, **whole,
        ))  # fmt: skip
    return out
