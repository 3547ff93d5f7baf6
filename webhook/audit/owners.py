"""Whether an object a judged controller names as its owner is what that controller would make.

The audit judges a Deployment's ReplicaSet and pods through the Deployment, so that a finding lands
once. An ownerReference is written by whoever creates the object, so a tenant can name any owner: an
object is left to its owner only when that owner was listed by the same scan (same namespace, kind
and uid) and one of its pod templates makes what the object runs, on the facts the rules read.
Per owner only a 16-byte digest per template is kept, never the object.

An owner deleted a moment ago still vouches for what it made, for `RECENT_SECONDS`: the garbage
collector removes those objects (a pod within its grace period), and in the meantime they are the
deleted owner's, not findings of their own. A forged reference to a deleted owner gains at most that
long, and only for an object its templates would make. Pure but for the clock.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from ..dra.objects import as_list, as_map, as_str
from ..dra.workloads import pod_labels_and_annotations, pod_templates_of
from ..engine.migration import node_labels_of
from ..policy.model import PolicySet

_CONTAINER_KEYS = ("initContainers", "containers")
# How long a deleted owner still vouches for what it made (twice the default full-scan period), and
# how many such digests an index keeps (a tenant that creates and deletes owners in a loop).
RECENT_SECONDS = 600.0
MAX_RECENT = 65_536


def metadata_keys(policies: PolicySet) -> tuple[frozenset[str], frozenset[str]]:
    """The label and annotation keys the tier policies classify by: the only metadata rules read."""
    labels: set[str] = set()
    notes: set[str] = set()
    for p in policies.tier:
        for c in p.classes:
            labels.update(c.match.labels)
            labels.update(c.match.label_words)
            notes.update(c.match.annotations)
    return frozenset(labels), frozenset(notes)


def _container(c: Any) -> Any:
    c = as_map(c)
    res = as_map(c.get("resources"))
    limits = dict(as_map(res.get("limits")))
    # The API server defaults a pod's requests to its limits; a template keeps them as written.
    requests = {**limits, **as_map(res.get("requests"))}
    return [
        c.get("name"),
        c.get("image"),
        c.get("command"),
        c.get("args"),
        limits,
        requests,
        res.get("claims"),
    ]


def _pods(obj: Mapping[str, Any]) -> int:
    return sum(t.replicas for t in pod_templates_of(obj))


def _digest(*parts: Any) -> bytes:
    try:
        data = orjson.dumps(list(parts), option=orjson.OPT_SORT_KEYS)
    except TypeError:  # too deep, or an int past 64 bits
        data = json.dumps(list(parts), sort_keys=True, default=str).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


class OwnerIndex:
    """Digests of (namespace, kind, uid, template facts) of the objects listed, per namespace."""

    def __init__(
        self,
        policies: PolicySet | None = None,
        dra_objects: Iterable[Mapping[str, Any]] = (),
        previous: OwnerIndex | None = None,
        namespace: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """`previous`: the index this one replaces, whole or (`namespace`) for one namespace; what
        it held and this one will not stays as recently seen."""
        self.label_keys, self.annotation_keys = (
            metadata_keys(policies) if policies is not None else (frozenset(), frozenset())
        )
        self._clock = clock or time.monotonic
        self._built = self._clock()
        self._by_ns: dict[str, set[bytes]] = {}
        # namespace -> digest of (namespace, kind, uid) -> the pods an owner runs: what it makes may
        # run no more (a ReplicaSet of 1,000 replicas is not its 1-replica Deployment's to answer for).
        self._pods: dict[str, dict[bytes, int]] = {}
        # namespace -> digest -> (when last indexed, its pod count where it is an owner's count).
        self._recent: dict[str, dict[bytes, tuple[float, int]]] = {}
        self._ns_built: dict[str, float] = {}  # namespaces rescanned since this index was built
        if previous is not None:
            self._carry(previous, namespace)
        # (namespace, name) -> digest of the claim spec a ResourceClaimTemplate makes.
        self._claim_templates: dict[tuple[str, str], bytes] = {}
        for o in dra_objects:
            if o.get("kind") == "ResourceClaimTemplate":
                meta = as_map(o.get("metadata"))
                key = (as_str(meta.get("namespace")) or "", as_str(meta.get("name")) or "")
                self._claim_templates[key] = _digest(as_map(as_map(o.get("spec")).get("spec")))

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_ns.values())

    def _carry(self, previous: OwnerIndex, namespace: str | None) -> None:
        now = self._clock()
        every = previous._by_ns.keys() | previous._recent.keys()
        spaces = [namespace] if namespace is not None else sorted(every)
        kept = 0
        for ns in spaces:
            recent = {
                d: seen for d, seen in previous._recent.get(ns, {}).items() if now - seen[0] < RECENT_SECONDS
            }
            seen_at = previous._seen_at(ns)
            for d in previous._by_ns.get(ns, ()):
                recent[d] = (seen_at, -1)
            for d, n in previous._pods.get(ns, {}).items():
                recent[d] = (seen_at, n)
            if kept + len(recent) > MAX_RECENT:  # the newest first: an old digest costs a judgement
                recent = dict(sorted(recent.items(), key=lambda kv: -kv[1][0])[: max(0, MAX_RECENT - kept)])
            kept += len(recent)
            if recent:
                self._recent[ns] = recent

    def _seen_at(self, namespace: str) -> float:
        return self._ns_built.get(namespace, self._built)

    def _known(self, namespace: str, digest: bytes) -> bool:
        if digest in self._by_ns.get(namespace, ()):
            return True
        seen = self._recent.get(namespace, {}).get(digest)
        return seen is not None and self._clock() - seen[0] < RECENT_SECONDS

    def _pod_count(self, namespace: str, key: bytes) -> int:
        pods = self._pods.get(namespace, {})
        if key in pods:
            return pods[key]
        seen = self._recent.get(namespace, {}).get(key)
        if seen is None or self._clock() - seen[0] >= RECENT_SECONDS:
            return 0
        return max(seen[1], 0)

    def _facts(self, obj: Mapping[str, Any]) -> list[bytes]:
        labels, notes = pod_labels_and_annotations(obj)
        meta = (
            sorted((k, labels[k]) for k in self.label_keys if k in labels),
            sorted((k, notes[k]) for k in self.annotation_keys if k in notes),
        )
        out = []
        for t in pod_templates_of(obj):
            spec = t.spec
            if t.container:  # a container-like template (TrainJob's trainer)
                containers: list[Any] = [[], [_container(spec)]]
            else:
                containers = [[_container(c) for c in as_list(spec.get(k))] for k in _CONTAINER_KEYS]
            out.append(_digest(containers, spec.get("resourceClaims"), node_labels_of(spec), meta))
        return out

    def add(self, obj: Mapping[str, Any]) -> None:
        """Index a listed object as a possible owner: of pods (its templates), and, for a pod, of
        the claims its ResourceClaimTemplates make."""
        meta = as_map(obj.get("metadata"))
        uid = as_str(meta.get("uid"))
        if not uid:
            return
        ns = as_str(meta.get("namespace")) or ""
        kind = as_str(obj.get("kind")) or ""
        found = self._by_ns.setdefault(ns, set())
        if kind != "Pod":  # a pod makes no pods
            for fp in self._facts(obj):
                found.add(_digest(ns, kind, uid, fp))
            key = _digest(ns, kind, uid)
            self._pods.setdefault(ns, {})[key] = _pods(obj)
        else:
            for entry in as_list(as_map(obj.get("spec")).get("resourceClaims")):
                entry = as_map(entry)
                name = as_str(entry.get("resourceClaimTemplateName")) or as_str(
                    as_map(entry.get("source")).get("resourceClaimTemplateName")
                )
                made = self._claim_templates.get((ns, name or ""))
                if made is not None:
                    found.add(_digest(ns, kind, uid, "claim", made))

    def made_by_owner(self, obj: Mapping[str, Any], ref: Mapping[str, Any]) -> bool:
        """True when the owner `ref` names was indexed and would make `obj` as it is."""
        meta = as_map(obj.get("metadata"))
        ns = as_str(meta.get("namespace")) or ""
        uid, kind = as_str(ref.get("uid")), as_str(ref.get("kind"))
        if (ns not in self._by_ns and ns not in self._recent) or not uid or not kind:
            return False
        if obj.get("kind") == "ResourceClaim":
            made = _digest(as_map(obj.get("spec")))
            return kind == "Pod" and self._known(ns, _digest(ns, kind, uid, "claim", made))
        facts = self._facts(obj)
        if not facts or not all(self._known(ns, _digest(ns, kind, uid, fp)) for fp in facts):
            return False
        return obj.get("kind") == "Pod" or _pods(obj) <= self._pod_count(ns, _digest(ns, kind, uid))

    def replace_namespace(self, namespace: str, other: OwnerIndex) -> None:
        """Take `other`'s entries for one namespace (a namespace rescan) in place of these."""
        self._by_ns[namespace] = other._by_ns.get(namespace, set())
        self._pods[namespace] = other._pods.get(namespace, {})
        if namespace in other._recent:
            self._recent[namespace] = other._recent[namespace]
        else:
            self._recent.pop(namespace, None)
        self._ns_built[namespace] = other._built
        self.label_keys, self.annotation_keys = other.label_keys, other.annotation_keys
