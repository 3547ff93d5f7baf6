"""Reads admission makes from the API server when its caches lack what a tier verdict needs.

The documented exception to "the request path reads caches": a ResourceClaim the control plane
makes for a pod is judged by that pod's workload class, a user's ResourceClaim by the unscheduled
pods that already name it, and a pod that names a template or claim this replica's watch has not
seen yet is judged by what the API server holds. Both are plain GETs in
the request's own namespace, at most `MAX_LOOKUPS` per request, within `LOOKUP_BUDGET` seconds in
all; a lookup that fails or runs out of time is reported as unreadable and the rule fails closed.

A review may be forged (any pod that reaches the admission port can send one), so what it names is
the sender's: nothing is read for a request whose object sits in another namespace than the request,
nor in a namespace the watch does not know, and an answer never quotes what was read (another
tenant's pod names, images, commands, labels): `redact` hides it. The verdict alone says what the
rule decided.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import quote

from ..dra.workloads import using_crd_table
from ..engine.rules.tier import lookups_needed
from .admission import Snapshot, is_checked

MAX_PENDING_PODS = 500
LOOKUP_BUDGET = 1.0  # seconds per request, well inside the validating webhooks' 3 s timeout
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
HIDDEN = "<hidden>"
_PLURAL = {
    "Pod": "pods",
    "ResourceClaim": "resourceclaims",
    "ResourceClaimTemplate": "resourceclaimtemplates",
}

Found = Literal["absent", "unreadable"]


class Getter(Protocol):
    """What lookups need of a client: GET a path, raising ApiError (with .status) on HTTP errors."""

    def get_json(self, path: str, query: list[tuple[str, Any]] | None = ..., timeout: float = ...) -> Any: ...


@dataclass(frozen=True, slots=True)
class Lookups:
    related: tuple[Mapping[str, Any], ...] = ()
    looked_up: Mapping[tuple[str, str, str], Found] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.related or self.looked_up)


def wanted(req: Mapping[str, Any], snap: Snapshot) -> list[tuple[str, str, str]]:
    """What the tier rule needs for this validating request that the snapshot lacks."""
    with using_crd_table(getattr(snap.policies, "crd_table", None)):
        return _wanted(req, snap)


def _wanted(req: Mapping[str, Any], snap: Snapshot) -> list[tuple[str, str, str]]:
    if snap.policies is None or not snap.policies.tier or req.get("operation") not in ("CREATE", "UPDATE"):
        return []
    raw_kind = req.get("kind")
    kind: Mapping[str, Any] = raw_kind if isinstance(raw_kind, Mapping) else {}
    group, version, k = (
        str(kind.get("group") or ""),
        str(kind.get("version") or ""),
        str(kind.get("kind") or ""),
    )
    obj = req.get("object")
    namespace = str(req.get("namespace") or "")
    if (
        req.get("subResource")
        or not isinstance(obj, Mapping)
        or not _NAMESPACE.match(namespace)
        or not is_checked(group, version, k)
    ):
        return []
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or meta.get("namespace") != namespace:
        # The API server sets the object's namespace to the request's: a review where they differ
        # was not sent by it, and reads on its behalf would reach into a namespace it chose.
        return []
    obj = {**obj, "kind": obj.get("kind") or k}
    if k == "ResourceClaim" and req.get("operation") != "CREATE":
        return []  # a claim's devices never change after creation
    labels = snap.namespace_labels.get(namespace)
    return [
        w
        for w in lookups_needed(
            obj, snap.policies.tier, snap.inventory, namespace, labels, snap.policies.tier_index
        )
        if _NAME.match(w[2]) and len(w[2]) <= 253
    ]


def _path(kind: str, namespace: str, name: str, served: frozenset[str]) -> str:
    ns, name = quote(namespace, safe=""), quote(name, safe="")
    if kind == "Pod":
        return f"/api/v1/namespaces/{ns}/pods/{name}"
    version = next((v for v in ("v1", "v1beta2", "v1beta1") if v in served), "v1")
    return f"/apis/resource.k8s.io/{version}/namespaces/{ns}/{_PLURAL[kind]}/{name}"


def fetch(
    http: Getter, wants: list[tuple[str, str, str]], snap: Snapshot, budget: float = LOOKUP_BUDGET
) -> Lookups:
    """GET each wanted object within `budget` seconds in all (blocking: run it off the event loop)."""
    related: list[Mapping[str, Any]] = []
    looked: dict[tuple[str, str, str], Found] = {}
    deadline = time.monotonic() + budget
    for kind, ns, name in wants:
        left = deadline - time.monotonic()
        if left <= 0.05 or (snap.namespace_labels and ns not in snap.namespace_labels):
            # Out of time, or a namespace the watch does not know (not created, or not seen yet):
            # unreadable, so the rule fails closed without a read.
            looked[(kind, ns, name)] = "unreadable"
            continue
        if kind in ("PendingPods", "GroupPods"):
            found, complete = _pending_pods(http, ns, name, left, by_group=kind == "GroupPods")
            related.extend(found)
            if not complete:
                looked[(kind, ns, name)] = "unreadable"
            continue
        try:
            obj = http.get_json(_path(kind, ns, name, snap.served_versions), timeout=left)
        except Exception as e:  # ApiError, timeouts, connection errors: all mean "not known"
            looked[(kind, ns, name)] = "absent" if getattr(e, "status", None) == 404 else "unreadable"
            continue
        if isinstance(obj, Mapping) and obj.get("kind") == kind:
            related.append(obj)
        else:
            looked[(kind, ns, name)] = "unreadable"
    return Lookups(tuple(related), looked)


def _pending_pods(
    http: Getter, namespace: str, name: str, timeout: float, by_group: bool = False
) -> tuple[list[Mapping[str, Any]], bool]:
    """Unscheduled pods of `namespace` that name ResourceClaim `name` (or, `by_group`, that belong to
    PodGroup `name`), and whether that is all of them.

    One page of `MAX_PENDING_PODS`, filtered by the API server to pods without a node (a scheduled
    pod's claim is allocated and cannot be replaced under it; a group's claim is allocated before
    any of its pods is bound).
    """
    # No resourceVersion: a consistent list. A pod admitted a millisecond before this claim must be
    # in it, and "any version" from the watch cache could lag behind exactly that.
    query: list[tuple[str, Any]] = [("fieldSelector", "spec.nodeName="), ("limit", MAX_PENDING_PODS)]
    try:
        doc = http.get_json(f"/api/v1/namespaces/{quote(namespace, safe='')}/pods", query, timeout=timeout)
    except Exception:
        return [], False
    if not isinstance(doc, Mapping):
        return [], False
    out: list[Mapping[str, Any]] = []
    for item in doc.get("items") or []:
        if not isinstance(item, Mapping):
            continue
        spec = item.get("spec")
        if not isinstance(spec, Mapping):
            continue
        if by_group:
            group = spec.get("schedulingGroup")
            if isinstance(group, Mapping) and group.get("podGroupName") == name:
                out.append({**item, "apiVersion": "v1", "kind": "Pod"})
            continue
        claims = spec.get("resourceClaims") or []
        if isinstance(claims, list) and any(
            isinstance(c, Mapping) and c.get("resourceClaimName") == name for c in claims
        ):
            out.append({**item, "apiVersion": "v1", "kind": "Pod"})
    # More pods than one page: what was found still counts; the rest is unknown.
    return out, not (doc.get("metadata") or {}).get("continue")


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    if depth > 32:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v, depth + 1)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v, depth + 1)


def _read_text(obj: Mapping[str, Any]) -> Iterator[str]:
    """What of a read object a finding can quote: its name, labels and annotations, and its
    containers' images, commands and arguments (word by word, as the tier rule reads them)."""
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        yield from _strings(meta.get("name"))
        for key in ("labels", "annotations"):
            yield from _strings(meta.get(key))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or ():
            if not isinstance(c, Mapping):
                continue
            yield from _strings(c.get("image"))
            for text in _strings([c.get("command"), c.get("args")]):
                yield text
                yield from text.split()


def private_text(looked: Lookups | None, req: Mapping[str, Any], snap: Snapshot) -> list[str]:
    """Strings of the objects read for this request that the request itself does not carry, longest
    first (what redact hides). Names every tenant sees anyway (the request's namespace, tier policies
    and classes, DeviceClasses) stay, so the message still says which rule and class decided."""
    if not looked or not looked.related:
        return []
    known = set(_strings(req.get("object")))
    known.add(str(req.get("namespace") or ""))
    for policy in getattr(snap.policies, "tier", None) or ():
        known.add(policy.name)
        for c in policy.classes:
            known.add(c.name)
            known.update(c.device_classes)
    known.update(snap.inventory.classes)
    # Shorter strings (a label value "a") would hide parts of words everywhere in the message.
    found = {t for obj in looked.related for t in _read_text(obj) if len(t) >= 3 and t not in known}
    return sorted(found, key=lambda t: (-len(t), t))


def redact(response: dict[str, Any], private: list[str]) -> dict[str, Any]:
    """The response with every private string in its message and warnings replaced by HIDDEN."""
    if not private:
        return response

    def hide(text: str) -> str:
        for p in private:
            if p in text:
                text = text.replace(p, HIDDEN)
        return text

    out = dict(response)
    status = out.get("status")
    if isinstance(status, Mapping) and isinstance(status.get("message"), str):
        out["status"] = {**status, "message": hide(status["message"])}
    if isinstance(out.get("warnings"), list):
        out["warnings"] = [hide(w) if isinstance(w, str) else w for w in out["warnings"]]
    return out
