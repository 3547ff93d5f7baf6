"""Reads admission makes from the API server when its caches lack what a tier verdict needs.

The documented exception to "the request path reads caches": a ResourceClaim the control plane
makes for a pod is judged by that pod's workload class, a user's ResourceClaim by the unscheduled
pods that already name it, and a pod that names a template or claim this replica's watch has not
seen yet is judged by what the API server holds. Both are plain GETs in
the request's own namespace, at most `MAX_LOOKUPS` per request, within `LOOKUP_BUDGET` seconds in
all; a lookup that fails or runs out of time is reported as unreadable and the rule fails closed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from webhook.dra.workloads import using_crd_table
from webhook.engine.rules.tier import lookups_needed
from webhook.server.admission import Snapshot, is_checked

MAX_PENDING_PODS = 500
LOOKUP_BUDGET = 1.0  # seconds per request, well inside the validating webhooks' 3 s timeout
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
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
        or not namespace
        or not is_checked(group, version, k)
    ):
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
    if kind == "Pod":
        return f"/api/v1/namespaces/{namespace}/pods/{name}"
    version = next((v for v in ("v1", "v1beta2", "v1beta1") if v in served), "v1")
    return f"/apis/resource.k8s.io/{version}/namespaces/{namespace}/{_PLURAL[kind]}/{name}"


def fetch(
    http: Getter, wants: list[tuple[str, str, str]], snap: Snapshot, budget: float = LOOKUP_BUDGET
) -> Lookups:
    """GET each wanted object within `budget` seconds in all (blocking: run it off the event loop)."""
    related: list[Mapping[str, Any]] = []
    looked: dict[tuple[str, str, str], Found] = {}
    deadline = time.monotonic() + budget
    for kind, ns, name in wants:
        left = deadline - time.monotonic()
        if left <= 0.05:
            looked[(kind, ns, name)] = "unreadable"
            continue
        if kind == "PendingPods":
            found, complete = _pending_pods(http, ns, name, left)
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
    http: Getter, namespace: str, claim: str, timeout: float
) -> tuple[list[Mapping[str, Any]], bool]:
    """Unscheduled pods of `namespace` that name ResourceClaim `claim`, and whether that is all of them.

    One page of `MAX_PENDING_PODS`, filtered by the API server to pods without a node (a scheduled
    pod's claim is allocated and cannot be replaced under it).
    """
    # No resourceVersion: a consistent list. A pod admitted a millisecond before this claim must be
    # in it, and "any version" from the watch cache could lag behind exactly that.
    query: list[tuple[str, Any]] = [("fieldSelector", "spec.nodeName="), ("limit", MAX_PENDING_PODS)]
    try:
        doc = http.get_json(f"/api/v1/namespaces/{namespace}/pods", query, timeout=timeout)
    except Exception:
        return [], False
    if not isinstance(doc, Mapping):
        return [], False
    out: list[Mapping[str, Any]] = []
    for item in doc.get("items") or []:
        if not isinstance(item, Mapping):
            continue
        claims = ((item.get("spec") or {}).get("resourceClaims")) or []
        if any(isinstance(c, Mapping) and c.get("resourceClaimName") == claim for c in claims):
            out.append({**item, "apiVersion": "v1", "kind": "Pod"})
    # More pods than one page: what was found still counts; the rest is unknown.
    return out, not (doc.get("metadata") or {}).get("continue")
