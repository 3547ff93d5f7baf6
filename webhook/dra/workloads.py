"""Where the pod spec lives in each workload kind, and how many pods a workload asks for."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.dra.objects import as_int, as_list, as_map, as_str

# kind -> path (as keys) from the object root to the PodSpec.
POD_SPEC_PATHS: Mapping[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
WORKLOAD_KINDS: frozenset[str] = frozenset(POD_SPEC_PATHS)


def _walk(obj: Mapping[str, Any], path: tuple[str, ...]) -> Mapping[str, Any] | None:
    cur: Any = obj
    for key in path:
        # type() first: parsed JSON is plain dicts, and the ABC check is the slow part of this walk.
        if type(cur) is not dict and not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur if type(cur) is dict or isinstance(cur, Mapping) else None


def pod_spec_of(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """(JSON pointer, PodSpec) of a workload object, or None for other kinds or a missing spec."""
    path = POD_SPEC_PATHS.get(as_str(obj.get("kind")) or "")
    if path is None:
        return None
    spec = _walk(obj, path)
    if spec is None:
        return None
    return "/" + "/".join(path), spec


def pod_metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The metadata pods of this workload get: the template's (merged over nothing) or the Pod's own."""
    path = POD_SPEC_PATHS.get(as_str(obj.get("kind")) or "")
    if path is None:
        return {}
    meta = _walk(obj, (*path[:-1], "metadata"))
    return meta if meta is not None else {}


def pod_labels(obj: Mapping[str, Any]) -> dict[str, str]:
    """Labels a workload's pods carry, with the workload's own labels underneath."""
    out = {k: v for k, v in as_map(as_map(obj.get("metadata")).get("labels")).items() if isinstance(v, str)}
    if obj.get("kind") != "Pod":
        out.update(
            {k: v for k, v in as_map(pod_metadata_of(obj).get("labels")).items() if isinstance(v, str)}
        )
    return out


def pod_annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    """Annotations of the workload and its pod template (template wins)."""
    meta = as_map(obj.get("metadata"))
    out = {k: v for k, v in as_map(meta.get("annotations")).items() if isinstance(v, str)}
    if obj.get("kind") != "Pod":
        out.update(
            {k: v for k, v in as_map(pod_metadata_of(obj).get("annotations")).items() if isinstance(v, str)}
        )
    return out


def replicas_of(obj: Mapping[str, Any]) -> int:
    """Pods the workload runs at once.

    replicas for Deployment/ReplicaSet/StatefulSet/ReplicationController (default 1); parallelism
    for Job and CronJob (default 1, capped by completions); DaemonSet and Pod count 1 (a DaemonSet
    runs one pod per node, which only the cluster knows: callers multiply by node count if needed).
    """
    kind = obj.get("kind")
    spec = as_map(obj.get("spec"))
    if kind in ("Deployment", "ReplicaSet", "StatefulSet", "ReplicationController"):
        n = as_int(spec.get("replicas"))
        return max(n, 0) if n is not None else 1
    if kind == "CronJob":
        spec = as_map(as_map(spec.get("jobTemplate")).get("spec"))
        kind = "Job"
    if kind == "Job":
        par = as_int(spec.get("parallelism"))
        n = max(par, 0) if par is not None else 1
        comp = as_int(spec.get("completions"))
        return min(n, max(comp, 0)) if comp is not None else n
    return 1


@dataclass(frozen=True, slots=True)
class ContainerRef:
    pointer: str
    container: Mapping[str, Any]
    init: bool


def containers_of(pod_pointer: str, spec: Mapping[str, Any]) -> Iterator[ContainerRef]:
    """initContainers then containers (the order the scheduler numbers them), with pointers."""
    for key, init in (("initContainers", True), ("containers", False)):
        for i, c in enumerate(as_list(spec.get(key))):
            if isinstance(c, Mapping):
                yield ContainerRef(f"{pod_pointer}/{key}/{i}", c, init)


def command_line(container: Mapping[str, Any]) -> list[str]:
    """command + args as strings (non-strings dropped)."""
    return [
        a for a in (*as_list(container.get("command")), *as_list(container.get("args"))) if isinstance(a, str)
    ]


def _whole(value: Any) -> int:
    """An extended-resource quantity as a whole number (extended resources allow no fractions)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return 0


def container_amounts(container: Mapping[str, Any]) -> dict[str, int]:
    """Whole-number resources a container asks for: the limit, else the request (extended resources
    must have both equal, and a device plugin allocates by the limit)."""
    res = as_map(container.get("resources"))
    limits, requests = as_map(res.get("limits")), as_map(res.get("requests"))
    out: dict[str, int] = {}
    for name in dict.fromkeys([*limits, *requests]):
        if isinstance(name, str):
            n = _whole(limits[name] if name in limits else requests[name])
            if n:
                out[name] = n
    return out


def effective_amounts(spec: Mapping[str, Any], keep: Any = None) -> dict[str, int]:
    """What a pod holds of each whole-number resource, as Kubernetes computes effective requests:
    max(sum over app containers + restartable (sidecar) init containers, each ordinary init container
    + the sidecars started before it). `keep(name)` filters resource names."""
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for c in as_list(spec.get("initContainers")):
        if not isinstance(c, Mapping):
            continue
        amounts = {k: v for k, v in container_amounts(c).items() if keep is None or keep(k)}
        if c.get("restartPolicy") == "Always":
            for k, v in amounts.items():
                sidecars[k] = sidecars.get(k, 0) + v
                init_peak[k] = max(init_peak.get(k, 0), sidecars[k])
        else:
            for k in set(amounts) | set(sidecars):
                init_peak[k] = max(init_peak.get(k, 0), amounts.get(k, 0) + sidecars.get(k, 0))
    app: dict[str, int] = dict(sidecars)
    for c in as_list(spec.get("containers")):
        if isinstance(c, Mapping):
            for k, v in container_amounts(c).items():
                if keep is None or keep(k):
                    app[k] = app.get(k, 0) + v
    return {k: max(app.get(k, 0), init_peak.get(k, 0)) for k in set(app) | set(init_peak)
            if max(app.get(k, 0), init_peak.get(k, 0)) > 0}  # fmt: skip
