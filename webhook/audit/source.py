"""What a scan reads from the API server: paged lists, trimmed as they arrive, so memory holds one
page of workloads at a time plus the DRA objects and namespace labels the engine consults."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..dra.inventory import Inventory
from ..dra.objects import as_list, as_map, as_str
from ..server.caches import ApiError, KubeHttp, discover_dra_versions
from .evaluate import WORKLOADS
from .owners import OwnerIndex

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

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Collection:
    """A kind the audit lists: `group_version` ("v1", "apps/v1"), plural `resource`, `kind`."""

    group_version: str
    resource: str
    kind: str
    crd: bool = False

    @property
    def group(self) -> str:
        return self.group_version.rpartition("/")[0]

    def path(self, namespace: str | None = None) -> str:
        return api_path(f"{self.group_version}/{self.resource}", namespace)


BUILTIN: tuple[Collection, ...] = tuple(
    Collection(gvr.rsplit("/", 1)[0], gvr.rsplit("/", 1)[1], kind) for gvr, kind in WORKLOADS
)


def crd_collections(http: KubeHttp, table: Iterable[tuple[str, str]]) -> list[Collection]:
    """The workload CRDs of `table` ((group, kind)s) that the API server serves, at each group's
    preferred version, found by discovery (which every authenticated client may read). A group the
    server does not serve is skipped: its operator is not installed."""
    wanted: dict[str, set[str]] = {}
    for group, kind in table:
        wanted.setdefault(group, set()).add(kind)
    out: list[Collection] = []
    for group in sorted(wanted):
        try:
            doc = http.get_json(f"/apis/{group}")
        except ApiError as e:
            if e.status == 404:
                continue
            raise ScanError(f"cannot discover API group {group}: {e}", e.status) from e
        gv = as_str(as_map(doc.get("preferredVersion")).get("groupVersion"))
        if not gv:
            continue
        try:
            res = http.get_json(f"/apis/{gv}")
        except ApiError as e:
            if e.status == 404:
                continue
            raise ScanError(f"cannot discover {gv}: {e}", e.status) from e
        for r in as_list(res.get("resources")):
            r = as_map(r)
            name, kind = as_str(r.get("name")) or "", as_str(r.get("kind")) or ""
            if "/" in name or kind not in wanted[group] or r.get("namespaced") is not True:
                continue
            if "list" in as_list(r.get("verbs")):
                out.append(Collection(gv, name, kind, crd=True))
    return out


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


# Deeper than any pod template sits in a workload; what lies below is cut off (see `shallow`).
MAX_DEPTH = 64
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def shallow(data: bytes, max_depth: int = MAX_DEPTH) -> bytes:
    """JSON text with every array or object nested deeper than `max_depth` replaced by null, so that
    a hostile document decodes in bounded recursion (and the rules see none of the cut part)."""
    out: list[bytes] = []
    depth = 0
    cut_at = -1  # where the container being cut off starts
    last = 0
    for m in _TOKEN.finditer(data):
        tok = m.group()
        if tok[0] == 0x22:  # a string: brackets inside it are text
            continue
        if tok in (b"[", b"{"):
            depth += 1
            if depth == max_depth + 1 and cut_at < 0:
                cut_at = m.start()
        else:
            depth -= 1
            if depth == max_depth and cut_at >= 0:
                out.append(data[last:cut_at])
                out.append(b"null")
                last, cut_at = m.end(), -1
    out.append(data[last:])
    return b"".join(out)


def _get_shallow(http: KubeHttp, path: str, query: list[tuple[str, Any]]) -> dict[str, Any]:
    resp = http.stream(path, query, read_timeout=60.0)
    try:
        data = resp.read()
    finally:
        resp.release_conn()
    doc = json.loads(shallow(data))
    return doc if isinstance(doc, dict) else {}


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
            try:
                doc = http.get_json(path, q, timeout=60.0)
            except RecursionError:
                # A tenant's object nested past what the decoder follows (a CRD that keeps unknown
                # fields): read the page again with what lies below MAX_DEPTH cut off.
                doc = _get_shallow(http, path, q)
        except ApiError as e:
            if e.status == 410 and cont:
                cont, seen = "", set(yielded)
                continue
            raise ScanError(f"cannot list {path}: {e}", e.status) from e
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
    # What the last full scan listed: workload CRDs first (so that their pods' owners are known
    # before the pods are filtered), then the built-in kinds, owners before what they make.
    collections: tuple[Collection, ...] = BUILTIN
    # What the listed controllers would make (kept up to date by namespace rescans): the watches
    # drop events only of objects it vouches for.
    owners: OwnerIndex = field(default_factory=OwnerIndex)


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
    kept: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []
    for o in state.dra_objects:
        mine = o.get("kind") in NAMESPACED_DRA and (o.get("metadata") or {}).get("namespace") == namespace
        (before if mine else kept).append(o)
    if _by_key(before) == _by_key(fresh):
        return  # the inventory stands (building it is most of a small namespace's rescan)
    state.dra_objects = kept + fresh
    state.inventory = Inventory.from_objects(state.dra_objects)


def _by_key(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(str(o.get("kind")), str((o.get("metadata") or {}).get("name"))): o for o in objs}


def workload_pages(
    http: KubeHttp,
    page: int = PAGE,
    namespace: str | None = None,
    collections: Sequence[Collection] = BUILTIN,
    unlisted: list[tuple[Collection, str]] | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """Every collection's objects, page by page. A workload CRD the audit may not list (403: its
    RBAC was not extended to a kind a WorkloadKindPolicy adds) goes to `unlisted` with the reason,
    when given, instead of failing the scan."""
    for c in collections:
        try:
            yield from list_pages(http, c.path(namespace), c.group_version, c.kind, page)
        except ScanError as e:
            if not (c.crd and e.status in (403, 404) and unlisted is not None):
                raise
            unlisted.append((c, str(e)))


def judged_pages(
    http: KubeHttp,
    state: ClusterState,
    keep: Callable[[Mapping[str, Any]], bool],
    page: int = PAGE,
    namespace: str | None = None,
    collections: Sequence[Collection] = BUILTIN,
    unlisted: list[tuple[Collection, str]] | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """Pages of objects to judge: the DRA objects already read, then every workload list (of one
    namespace, or of all), then the claims that name a pod as their owner (decided once the pods
    are listed)."""
    dra: list[dict[str, Any]] = []
    pod_claims: list[dict[str, Any]] = []
    for o in state.dra_objects:
        if o.get("kind") == "ResourceSlice":
            continue
        if namespace is not None and (o.get("metadata") or {}).get("namespace") != namespace:
            continue
        (pod_claims if _pod_owned(o) else dra).append(o)
    dra = [o for o in dra if keep(o)]
    for i in range(0, len(dra), page):
        yield dra[i : i + page]
    for items in workload_pages(http, page, namespace, collections, unlisted):
        kept = [o for o in items if keep(o)]
        if kept:
            yield kept
    claims = [o for o in pod_claims if keep(o)]
    for i in range(0, len(claims), page):
        yield claims[i : i + page]


def _pod_owned(obj: Mapping[str, Any]) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences")
    return isinstance(refs, list) and any(
        isinstance(r, dict) and r.get("controller") is True and r.get("kind") == "Pod" for r in refs
    )
