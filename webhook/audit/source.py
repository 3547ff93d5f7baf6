"""What a scan reads from the API server: paged lists, trimmed as they arrive, so memory holds one
page of workloads at a time plus the DRA objects and namespace labels the engine consults."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.audit.evaluate import WORKLOADS
from webhook.dra.inventory import Inventory
from webhook.server.caches import ApiError, KubeHttp, discover_dra_versions

PAGE = 500
DRA_RESOURCES = (
    ("resourceslices", "ResourceSlice"),
    ("deviceclasses", "DeviceClass"),
    ("resourceclaims", "ResourceClaim"),
    ("resourceclaimtemplates", "ResourceClaimTemplate"),
)
# A copy of the whole object as last applied: often the largest annotation, and no rule reads it.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_KEEP_META = ("name", "namespace", "uid", "labels", "annotations", "ownerReferences", "generateName")


class ScanError(Exception):
    """The cluster could not be read completely; the scan writes nothing."""


def trim(obj: dict[str, Any], keep_status: bool = False) -> dict[str, Any]:
    """What the rules read: identity, labels, annotations, owners and spec (no managedFields, and no
    status except for claims, whose allocation the inventory counts)."""
    meta = obj.get("metadata")
    out: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind", "spec") if k in obj}
    if isinstance(meta, dict):
        kept = {k: meta[k] for k in _KEEP_META if k in meta}
        notes = kept.get("annotations")
        if isinstance(notes, dict) and LAST_APPLIED in notes:
            kept["annotations"] = {k: v for k, v in notes.items() if k != LAST_APPLIED}
        out["metadata"] = kept
    if keep_status and "status" in obj:
        out["status"] = obj["status"]
    return out


def api_path(group_version_resource: str, namespace: str | None = None) -> str:
    """The collection's path, across namespaces or in one."""
    gv, _, resource = group_version_resource.rpartition("/")
    base = f"/api/{gv}" if gv == "v1" else f"/apis/{gv}"
    return f"{base}/namespaces/{namespace}/{resource}" if namespace else f"{base}/{resource}"


def list_pages(
    http: KubeHttp,
    path: str,
    api_version: str,
    kind: str,
    page: int = PAGE,
    keep_status: bool = False,
    query: tuple[tuple[str, str], ...] = (),
) -> Iterator[list[dict[str, Any]]]:
    """One list of `path`, page by page. A continue token that expired (410) restarts the list,
    skipping objects already yielded (by uid)."""
    cont = ""
    seen: set[str] | None = None
    yielded: set[str] = set()
    while True:
        q: list[tuple[str, Any]] = [("limit", page), *query]
        if cont:
            q.append(("continue", cont))
        try:
            doc = http.get_json(path, q, timeout=60.0)
        except ApiError as e:
            if e.status == 410 and cont:
                cont, seen = "", set(yielded)
                continue
            raise ScanError(f"cannot list {path}: {e}") from e
        items = []
        for it in doc.get("items") or []:
            if not isinstance(it, dict):
                continue
            it.setdefault("apiVersion", api_version)
            it.setdefault("kind", kind)
            o = trim(it, keep_status)
            uid = str((o.get("metadata") or {}).get("uid") or "")
            if seen is not None and uid in seen:
                continue
            if uid:
                yielded.add(uid)
            items.append(o)
        yield items
        cont = str((doc.get("metadata") or {}).get("continue") or "")
        if not cont:
            return


@dataclass
class ClusterState:
    """What the engine consults besides the judged objects."""

    inventory: Inventory
    namespace_labels: dict[str, dict[str, str]]
    served_versions: frozenset[str]
    dra_objects: list[dict[str, Any]] = field(default_factory=list)
    dra_version: str | None = None


def read_state(http: KubeHttp) -> ClusterState:
    try:
        version, served = discover_dra_versions(http)
    except ApiError as e:
        raise ScanError(f"cannot read resource.k8s.io versions: {e}") from e
    dra: list[dict[str, Any]] = []
    if version is not None:
        av = f"resource.k8s.io/{version}"
        for res, kind in DRA_RESOURCES:
            for items in list_pages(http, f"/apis/{av}/{res}", av, kind, keep_status=kind == "ResourceClaim"):
                dra.extend(items)
    labels: dict[str, dict[str, str]] = {}
    for items in list_pages(http, "/api/v1/namespaces", "v1", "Namespace"):
        for ns in items:
            meta = ns.get("metadata") or {}
            lab = meta.get("labels") or {}
            labels[str(meta.get("name"))] = {str(k): str(v) for k, v in lab.items()}
    return ClusterState(Inventory.from_objects(dra), labels, served, dra, version)


NAMESPACED_DRA = ("ResourceClaim", "ResourceClaimTemplate")


def refresh_namespace(http: KubeHttp, state: ClusterState, namespace: str) -> None:
    """Bring `state` up to date for one namespace: its labels, claims and templates (the cluster's
    slices and classes stay as the last full scan read them)."""
    labels: dict[str, str] | None = None
    q = (("fieldSelector", f"metadata.name={namespace}"),)
    for items in list_pages(http, "/api/v1/namespaces", "v1", "Namespace", query=q):
        for ns in items:
            lab = (ns.get("metadata") or {}).get("labels") or {}
            labels = {str(k): str(v) for k, v in lab.items()}
    if labels is None:
        state.namespace_labels.pop(namespace, None)
    else:
        state.namespace_labels[namespace] = labels
    if state.dra_version is None:
        return
    av = f"resource.k8s.io/{state.dra_version}"
    fresh: list[dict[str, Any]] = []
    for res, kind in DRA_RESOURCES:
        if kind in NAMESPACED_DRA:
            path = f"/apis/{av}/namespaces/{namespace}/{res}"
            for items in list_pages(http, path, av, kind, keep_status=kind == "ResourceClaim"):
                fresh.extend(items)
    kept = [
        o
        for o in state.dra_objects
        if not (o.get("kind") in NAMESPACED_DRA and (o.get("metadata") or {}).get("namespace") == namespace)
    ]
    state.dra_objects = kept + fresh
    state.inventory = Inventory.from_objects(state.dra_objects)


def workload_pages(
    http: KubeHttp, page: int = PAGE, namespace: str | None = None
) -> Iterator[list[dict[str, Any]]]:
    for gvr, kind in WORKLOADS:
        api_version = gvr.rsplit("/", 1)[0]
        yield from list_pages(http, api_path(gvr, namespace), api_version, kind, page)


def judged_pages(
    http: KubeHttp,
    state: ClusterState,
    keep: Callable[[Mapping[str, Any]], bool],
    page: int = PAGE,
    namespace: str | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """Pages of objects to judge: the DRA objects already read, then every workload list (of one
    namespace, or of all)."""
    dra = [
        o
        for o in state.dra_objects
        if o.get("kind") != "ResourceSlice"
        and (namespace is None or (o.get("metadata") or {}).get("namespace") == namespace)
        and keep(o)
    ]
    for i in range(0, len(dra), page):
        yield dra[i : i + page]
    for items in workload_pages(http, page, namespace):
        kept = [o for o in items if keep(o)]
        if kept:
            yield kept
