"""Pod -> claim/template -> DeviceClass, across the input set and the inventory."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from ..core.frozen import one_call_init
from ..core.source import SourceObject
from ..dra.device import Device
from ..dra.inventory import ClaimRecord, Inventory, claim_record
from ..dra.objects import (
    ClaimSpec,
    DeviceClassSpec,
    as_list,
    as_map,
    as_str,
    dra_version,
    read_claim_spec,
    read_device_class,
)
from ..dra.quantity import Quantity
from ..dra.workloads import pod_spec_of, pod_templates_of

CLUSTER_SCOPED_KINDS: frozenset[str] = frozenset(
    {
        "DeviceClass",
        "ResourceSlice",
        "Namespace",
        "Node",
        "ClusterRole",
        "ClusterRoleBinding",
        "DeviceTaintRule",
    }
)


def namespace_of(obj: Mapping[str, Any], default_namespace: str = "default") -> str | None:
    """The object's namespace; the default for namespaced objects without one; None if cluster-scoped."""
    if as_str(obj.get("kind")) in CLUSTER_SCOPED_KINDS:
        return None
    return as_str(as_map(obj.get("metadata")).get("namespace")) or default_namespace


K = TypeVar("K")
V = TypeVar("V")


class Over(Mapping[K, V]):
    """`top` laid over `base`, read-only: a lookup costs two dict reads, and building one costs
    nothing, whatever the size of `base` (iterating or sizing it walks both)."""

    __slots__ = ("base", "top")

    def __init__(self, top: Mapping[K, V], base: Mapping[K, V]) -> None:
        self.top, self.base = top, base

    def __getitem__(self, key: K) -> V:
        try:
            return self.top[key]
        except KeyError:
            return self.base[key]

    def __contains__(self, key: object) -> bool:
        return key in self.top or key in self.base

    def __iter__(self) -> Iterator[K]:
        yield from self.top
        yield from (k for k in self.base if k not in self.top)

    def __len__(self) -> int:
        return len(self.top) + sum(1 for k in self.base if k not in self.top)


@one_call_init
@dataclass(frozen=True, slots=True)
class Index:
    """Claims, templates and classes from the input set (first) and the inventory (second)."""

    claims: Mapping[tuple[str, str], ClaimRecord] = field(default_factory=dict)
    templates: Mapping[tuple[str, str], ClaimRecord] = field(default_factory=dict)
    classes: Mapping[str, DeviceClassSpec] = field(default_factory=dict)
    # (kind, namespace or "", name) -> the input object it came from.
    sources: Mapping[tuple[str, str, str], SourceObject] = field(default_factory=dict)

    @staticmethod
    def build(
        objects: Iterable[SourceObject], inventory: Inventory, default_namespace: str = "default"
    ) -> Index:
        objects = objects if type(objects) is list or isinstance(objects, Sequence) else list(objects)
        if not any(
            (type(i.obj) is dict or isinstance(i.obj, Mapping)) and dra_version(i.obj.get("apiVersion"))
            for i in objects
        ):
            # No claim, template or class in the input (admission of a workload): the inventory's
            # read-only maps serve as they are, and identity tells rules the classes are the cluster's.
            return Index(inventory.claims, inventory.templates, inventory.classes, {})
        # The input's claims and templates are laid over the inventory's, never merged into a copy:
        # a review of one claim must not cost a pass over every claim in the cluster (50,000 on a
        # 2,000-node cluster). Classes are few and rules iterate them, so they are copied.
        claims: dict[tuple[str, str], ClaimRecord] = {}
        templates: dict[tuple[str, str], ClaimRecord] = {}
        classes: dict[str, DeviceClassSpec] = dict(inventory.classes)
        sources: dict[tuple[str, str, str], SourceObject] = {}
        for item in objects:
            obj = item.obj
            if type(obj) is not dict and not isinstance(obj, Mapping):
                continue
            if dra_version(obj.get("apiVersion")) is None:
                continue
            kind = obj.get("kind")
            if kind == "DeviceClass":
                dc = read_device_class(obj)
                if dc.name:
                    classes[dc.name] = dc
                    sources[("DeviceClass", "", dc.name)] = item
                continue
            rec = claim_record(obj, default_namespace)
            if rec is None:
                continue
            (claims if rec.kind == "ResourceClaim" else templates)[(rec.namespace, rec.name)] = rec
            sources[(rec.kind, rec.namespace, rec.name)] = item
        return Index(Over(claims, inventory.claims), Over(templates, inventory.templates), classes, sources)

    def source_of(self, record: ClaimRecord) -> SourceObject | None:
        return self.sources.get((record.kind, record.namespace, record.name))


PodClaimKind = Literal["template", "claim", "inline", "invalid"]


@one_call_init
@dataclass(frozen=True, slots=True)
class PodClaim:
    """One `spec.resourceClaims[]` entry of a pod spec and what it resolves to."""

    name: str
    pointer: str
    kind: PodClaimKind
    target: str | None  # template/claim name
    record: ClaimRecord | None  # None when not found (or inline)
    spec: ClaimSpec | None  # the claim spec the pod gets, when known
    source: SourceObject | None  # the input object holding the spec, when it is in the input set
    spec_pointer_base: str = ""  # pointer prefix of `spec` inside its own object

    @property
    def resolved(self) -> bool:
        return self.spec is not None


def pod_claims(obj: Mapping[str, Any], index: Index, namespace: str) -> list[PodClaim]:
    """Resolve every `resourceClaims[]` entry of a workload's pod specs (every pod template of a
    workload CRD; empty for non-workloads)."""
    out: list[PodClaim] = []
    for pod_template in pod_templates_of(obj):
        if pod_template.container:
            continue
        pp, spec = pod_template.pointer, pod_template.spec
        for i, raw in enumerate(as_list(spec.get("resourceClaims"))):
            entry = as_map(raw)
            p = f"{pp}/resourceClaims/{i}"
            name = as_str(entry.get("name")) or ""
            tmpl = as_str(entry.get("resourceClaimTemplateName")) or None
            claim = as_str(entry.get("resourceClaimName")) or None
            source = entry.get("source")
            if tmpl is None and claim is None and isinstance(source, Mapping):
                # The pre-1.31 `source` wrapper: it held one of the two names, or (as some guides
                # show) an inline claim spec that was never part of the API.
                tmpl = as_str(source.get("resourceClaimTemplateName")) or None
                claim = as_str(source.get("resourceClaimName")) or None
                if tmpl is None and claim is None:
                    inline = read_claim_spec(source, "resource.k8s.io/v1beta1", f"{p}/source")
                    out.append(PodClaim(name, p, "inline", None, None, inline, None, f"{p}/source"))
                    continue
            if tmpl is not None:
                rec = index.templates.get((namespace, tmpl))
                out.append(_pod_claim(name, p, "template", tmpl, rec, index))
            elif claim is not None:
                rec = index.claims.get((namespace, claim))
                out.append(_pod_claim(name, p, "claim", claim, rec, index))
            else:
                out.append(PodClaim(name, p, "invalid", None, None, None, None))
    return out


def _pod_claim(
    name: str, p: str, kind: PodClaimKind, target: str, rec: ClaimRecord | None, index: Index
) -> PodClaim:
    if rec is None:
        return PodClaim(name, p, kind, target, None, None, None)
    base = "/spec/spec" if rec.kind == "ResourceClaimTemplate" else "/spec"
    return PodClaim(name, p, kind, target, rec, rec.spec, index.source_of(rec), base)


def requested_classes(spec: ClaimSpec) -> list[tuple[str, str, str]]:
    """(device class, pointer of the request/subrequest naming it, request name) for every alternative."""
    out: list[tuple[str, str, str]] = []
    for r in spec.requests:
        for cls, _sel, _mode, _count, ptr in r.alternatives():
            if cls:
                out.append((cls, ptr, r.name))
    return out


def claim_refs(spec_obj: Mapping[str, Any], pod_pointer: str) -> list[tuple[str, str, Any]]:
    """(claim name, pointer, the entry) of every `resources.claims[]` entry in the pod's containers.

    The entry is the one the pointer reaches, read on the way; None where the pointer cannot reach
    it, since a JSON pointer steps through lists and not tuples (objects built in Python)."""
    out: list[tuple[str, str, Any]] = []
    for key in ("initContainers", "containers"):
        containers = spec_obj.get(key)
        for ci, c in enumerate(as_list(containers)):
            claims = as_map(as_map(c).get("resources")).get("claims")
            for ri, ref in enumerate(as_list(claims)):
                n = as_str(as_map(ref).get("name"))
                if n is not None:
                    reached = ref if isinstance(containers, list) and isinstance(claims, list) else None
                    out.append((n, f"{pod_pointer}/{key}/{ci}/resources/claims/{ri}", reached))
    return out


def per_node_capacity(matched: Sequence[Device], group_by: Sequence[str] = ()) -> tuple[int, str | None]:
    """Largest number of matched devices one node can give (grouped by shared attribute values
    when the request is constrained); devices without a node (network-attached) count on every node."""
    shared = [d for d in matched if d.node is None]
    groups: dict[tuple[Any, ...], int] = {}
    for d in matched:
        if d.node is None:
            continue
        key: tuple[Any, ...] = (d.node,)
        skip = False
        for attr in group_by:
            dom, _, name = attr.rpartition("/")
            v = d.attributes.get(dom, {}).get(name)
            if v is None:
                skip = True
                break
            key += (v,)
        if not skip:
            groups[key] = groups.get(key, 0) + 1
    if not groups:
        return len(shared), None
    key_best = max(groups, key=lambda k: groups[k])
    return groups[key_best] + len(shared), str(key_best[0])


# -- KEP-5004: extended resources served by DeviceClasses -----------------------------------------

IMPLICIT_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
# Kubernetes' own resources, never served by a DeviceClass.
_NATIVE_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "storage", "pods"})


def extended_resource_classes(resource: str, classes: Mapping[str, DeviceClassSpec]) -> list[str]:
    """DeviceClasses that serve an extended resource through DRA (KEP-5004), sorted by name.

    `deviceclass.resource.kubernetes.io/<class>` names its class whether or not the cluster has it
    (it is allocated once the class exists); any other name is served by the classes whose
    `spec.extendedResourceName` is that name. Several classes declaring one name are all returned:
    which one the scheduler picks is not the user's to choose, so callers check each.
    """
    if resource.startswith(IMPLICIT_CLASS_PREFIX):
        name = resource[len(IMPLICIT_CLASS_PREFIX) :]
        return [name] if name else []
    if resource in _NATIVE_RESOURCES or resource.startswith(("hugepages-", "requests.", "limits.")):
        return []
    return sorted(c.name for c in classes.values() if c.extended_resource_name == resource)


@dataclass(frozen=True, slots=True)
class ExtendedRequest:
    """One container's request for an extended resource that a DeviceClass serves."""

    resource: str
    device_class: str
    count: int
    container: str
    init: bool
    sidecar: bool  # an init container with restartPolicy Always: runs alongside the app containers
    pointer: str  # JSON pointer to the request (or, without one, the limit) in the object


def _count(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    try:
        return Quantity.parse(value).as_integer()
    except (ValueError, OverflowError):
        return None


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def extended_requests(
    obj: Mapping[str, Any], classes: Mapping[str, DeviceClassSpec]
) -> list[ExtendedRequest]:
    """Every container's extended-resource requests that a DeviceClass serves (empty for non-workloads).

    Requests win over limits; a limit alone is the request (the API server defaults it so).
    Unparseable or non-positive counts are left to the API server, which rejects them.
    """
    found = pod_spec_of(obj)
    if found is None:
        return []
    pp, spec = found
    out: list[ExtendedRequest] = []
    for key, init in (("initContainers", True), ("containers", False)):
        for ci, raw in enumerate(as_list(spec.get(key))):
            c = as_map(raw)
            res = as_map(c.get("resources"))
            requests = as_map(res.get("requests"))
            limits = as_map(res.get("limits"))
            sidecar = init and as_str(c.get("restartPolicy")) == "Always"
            for name in dict.fromkeys([*requests.keys(), *limits.keys()]):
                if not isinstance(name, str) or "/" not in name:
                    continue
                served = extended_resource_classes(name, classes)
                if not served:
                    continue
                where = "requests" if name in requests else "limits"
                n = _count(requests[name] if name in requests else limits[name])
                if n is None or n <= 0:
                    continue
                ptr = f"{pp}/{key}/{ci}/resources/{where}/{_escape(name)}"
                cname = as_str(c.get("name")) or f"#{ci}"
                out.extend(ExtendedRequest(name, dc, n, cname, init, sidecar, ptr) for dc in served)
    return out


def extended_claims(obj: Mapping[str, Any], classes: Mapping[str, DeviceClassSpec]) -> dict[str, int]:
    """Devices one pod of the workload holds per DeviceClass through extended resources.

    As Kubernetes computes effective requests: app containers and sidecars add up, and each plain
    init container (which runs alone, before them) counts only if it asks for more.
    """
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for r in extended_requests(obj, classes):
        if r.init and not r.sidecar:
            # Sidecars started before this init container run alongside it.
            peak[r.device_class] = max(peak.get(r.device_class, 0), r.count + sidecars.get(r.device_class, 0))
        else:
            running[r.device_class] = running.get(r.device_class, 0) + r.count
            if r.sidecar:
                sidecars[r.device_class] = sidecars.get(r.device_class, 0) + r.count
    return {dc: max(running.get(dc, 0), peak.get(dc, 0)) for dc in sorted({*running, *peak})}


# -- claims the control plane creates for a pod -----------------------------------------------------

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


@dataclass(frozen=True, slots=True)
class OwnerPod:
    name: str
    uid: str | None


def owner_pod(claim: Mapping[str, Any]) -> OwnerPod | None:
    """The Pod a ResourceClaim belongs to: its controller ownerReference of kind Pod (core v1).

    The resourceclaim controller sets it on claims made from a pod's templates (with the
    `resource.kubernetes.io/pod-claim-name` annotation), the scheduler on the claim it makes for a
    pod's extended resources. Anyone may write an ownerReference, so this only says which pod's
    rules a claim must keep to, never that it may skip them.
    """
    for raw in as_list(as_map(claim.get("metadata")).get("ownerReferences")):
        ref = as_map(raw)
        if ref.get("controller") is not True or ref.get("kind") != "Pod" or ref.get("apiVersion") != "v1":
            continue
        name = as_str(ref.get("name"))
        if name:
            return OwnerPod(name, as_str(ref.get("uid")) or None)
    return None


def owner_pod_group(claim: Mapping[str, Any]) -> str | None:
    """The PodGroup a ResourceClaim was made for (KEP-5729: a PodGroup's `spec.resourceClaims` entry
    naming a template): its controller ownerReference of kind PodGroup in scheduling.k8s.io.

    Such a claim is shared by the group's pods, which name the same template in their own
    `spec.resourceClaims`; like `owner_pod`, it says whose rules the claim keeps to, never that it
    may skip them."""
    for raw in as_list(as_map(claim.get("metadata")).get("ownerReferences")):
        ref = as_map(raw)
        api = as_str(ref.get("apiVersion")) or ""
        if ref.get("controller") is not True or ref.get("kind") != "PodGroup":
            continue
        if api.partition("/")[0] != "scheduling.k8s.io":
            continue
        name = as_str(ref.get("name"))
        if name:
            return name
    return None


def pod_group_of(pod: Mapping[str, Any]) -> str | None:
    """The PodGroup a Pod belongs to (`spec.schedulingGroup.podGroupName`, Kubernetes 1.36+)."""
    return as_str(as_map(as_map(pod.get("spec")).get("schedulingGroup")).get("podGroupName")) or None


def pods_in_group(
    objects: Iterable[Mapping[str, Any]], namespace: str, group: str, default_namespace: str = "default"
) -> list[Mapping[str, Any]]:
    """Pods among `objects` in `namespace` that belong to PodGroup `group`."""
    return [
        obj
        for obj in objects
        if obj.get("kind") == "Pod" and obj.get("apiVersion") == "v1"
        and namespace_of(obj, default_namespace) == namespace and pod_group_of(obj) == group
    ]  # fmt: skip


def find_pod(
    objects: Iterable[Mapping[str, Any]], namespace: str, owner: OwnerPod, default_namespace: str = "default"
) -> Mapping[str, Any] | None:
    """The Pod `owner` names among `objects` (same namespace; same uid when both carry one)."""
    for obj in objects:
        if obj.get("kind") != "Pod" or obj.get("apiVersion") != "v1":
            continue
        meta = as_map(obj.get("metadata"))
        if as_str(meta.get("name")) != owner.name or namespace_of(obj, default_namespace) != namespace:
            continue
        uid = as_str(meta.get("uid"))
        if owner.uid and uid and uid != owner.uid:
            continue
        return obj
    return None


def pods_naming_claim(
    objects: Iterable[Mapping[str, Any]], namespace: str, claim: str, default_namespace: str = "default"
) -> list[Mapping[str, Any]]:
    """Pods among `objects` in `namespace` whose `spec.resourceClaims` name ResourceClaim `claim`."""
    out: list[Mapping[str, Any]] = []
    for obj in objects:
        if obj.get("kind") != "Pod" or obj.get("apiVersion") != "v1":
            continue
        if namespace_of(obj, default_namespace) != namespace:
            continue
        entries = as_list(as_map(obj.get("spec")).get("resourceClaims"))
        if any(as_str(as_map(e).get("resourceClaimName")) == claim for e in entries):
            out.append(obj)
    return out
