"""From a pod to the object a person edits: follow controller ownerReferences upward.

Pure: the caller supplies `lookup(api_version, kind, namespace, name)`, which returns the object
(or None when it is gone or unreadable). ReplicaSet -> Deployment, Job -> CronJob, and any workload
CRD that owns pods through ownerReferences resolve the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.findings import ObjectRef

# Deeper chains than this do not occur in practice (Deployment -> ReplicaSet -> Pod is the longest
# built-in one; a CRD adds one or two). A cycle or a hostile chain stops here.
MAX_DEPTH = 6

Lookup = Callable[[str, str, str, str], Mapping[str, Any] | None]

# Built-in groups whose objects run pods; any other built-in group (`*.k8s.io`, core) holds no
# workloads. A pod's ownerReferences are its author's to write: resolving one that names, say, a
# Secret must not make the assessment read that Secret.
_WORKLOAD_GROUPS = frozenset({"apps", "batch"})


def may_own_pods(api_version: str, kind: str) -> bool:
    """Whether an ownerReference may be followed: apps, batch, ReplicationController, or a
    custom resource (a dotted group outside Kubernetes' own `*.k8s.io`)."""
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    if group == "":
        return kind == "ReplicationController"
    if group in _WORKLOAD_GROUPS:
        return True
    return "." in group and not group.endswith(".k8s.io")


# An owner is named like any object a finding names (its namespace always set: pods are namespaced).
OwnerRef = ObjectRef


@dataclass(frozen=True, slots=True)
class Resolved:
    """The top owner found, the chain below it (pod's direct owner first), and why it stopped
    early if it did (`note`: e.g. an owner the API server no longer has)."""

    owner: OwnerRef
    chain: tuple[OwnerRef, ...]
    obj: Mapping[str, Any] | None
    note: str = ""


def controller_of(obj: Mapping[str, Any]) -> OwnerRef | None:
    """The ownerReference with `controller: true` (else the only reference), in obj's namespace."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    cands = [r for r in refs if isinstance(r, Mapping) and r.get("kind") and r.get("name")]
    chosen = next((r for r in cands if r.get("controller") is True), None)
    if chosen is None and len(cands) == 1:
        chosen = cands[0]
    if chosen is None:
        return None
    ns = meta.get("namespace")
    return OwnerRef(
        api_version=str(chosen.get("apiVersion") or ""),
        kind=str(chosen["kind"]),
        namespace=ns if isinstance(ns, str) else "",
        name=str(chosen["name"]),
    )


def ref_of(obj: Mapping[str, Any], default_api_version: str = "v1", default_kind: str = "Pod") -> OwnerRef:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return OwnerRef(
        api_version=str(obj.get("apiVersion") or default_api_version),
        kind=str(obj.get("kind") or default_kind),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
    )


def resolve(obj: Mapping[str, Any], lookup: Lookup, max_depth: int = MAX_DEPTH) -> Resolved:
    """The object a person edits for `obj` (itself when nothing controls it)."""
    start = ref_of(obj)
    chain: list[OwnerRef] = []
    current: Mapping[str, Any] = obj
    current_ref = start
    seen = {start}
    for _ in range(max_depth):
        ref = controller_of(current)
        if ref is None:
            return Resolved(current_ref, tuple(chain), current)
        if ref in seen:
            return Resolved(current_ref, tuple(chain), current, f"ownerReferences loop at {ref}")
        seen.add(ref)
        chain.append(ref)
        if not may_own_pods(ref.api_version, ref.kind):
            return Resolved(ref, tuple(chain), None, f"{ref} is not a workload kind: not followed")
        found = lookup(ref.api_version, ref.kind, ref.namespace or "", ref.name)
        if found is None:
            return Resolved(ref, tuple(chain), None, f"{ref} not readable (deleted, or no permission)")
        current, current_ref = found, ref
    return Resolved(current_ref, tuple(chain), current, f"ownerReferences deeper than {max_depth}")
