"""Which existing objects the audit judges, and their results, through the admission engine. Pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..core.source import SourceObject
from ..dra.inventory import Inventory
from ..dra.objects import as_list, as_map, as_str
from ..dra.workloads import pod_templates_of
from ..engine.context import ALL_RESOURCE_VERSIONS, Context
from ..engine.evaluate import evaluate
from ..engine.resolve import namespace_of
from ..policy.model import PolicySet
from .owners import OwnerIndex
from .report import Result, Subject, passed, result_of

# What the audit lists, as (API path under /api or /apis, kind): the built-in kinds the webhook judges
# at admission. Workload CRDs (the table in force, webhook/dra/workloads.py) are found by discovery,
# where their operator is installed (source.crd_collections). Owners come before what they make, so
# that a scan knows an owner (OwnerIndex) before it decides about the objects that name it.
WORKLOADS: tuple[tuple[str, str], ...] = (
    ("batch/v1/cronjobs", "CronJob"),
    ("batch/v1/jobs", "Job"),
    ("apps/v1/deployments", "Deployment"),
    ("apps/v1/replicasets", "ReplicaSet"),
    ("v1/replicationcontrollers", "ReplicationController"),
    ("apps/v1/statefulsets", "StatefulSet"),
    ("apps/v1/daemonsets", "DaemonSet"),
    ("v1/pods", "Pod"),
)
# A controller of one of these kinds is audited itself: what it creates is judged through its template.
AUDITED_OWNERS = frozenset(
    {"ReplicationController", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod"}
)
JUDGED_DRA_KINDS = frozenset({"DeviceClass", "ResourceClaim", "ResourceClaimTemplate"})


def controller_of(
    obj: Mapping[str, Any], crds: frozenset[tuple[str, str]] = frozenset()
) -> Mapping[str, Any] | None:
    """The controller ownerReference when it names a kind the audit also judges (a Deployment for
    its ReplicaSet, a ReplicaSet or Job for its pods, a pod for its generated claims, a PyTorchJob
    for its pods when `crds`, the (group, kind)s the audit lists, hold PyTorchJob)."""
    for ref in as_list(as_map(obj.get("metadata")).get("ownerReferences")):
        ref = as_map(ref)
        if ref.get("controller") is not True:
            continue
        kind = as_str(ref.get("kind")) or ""
        if kind in AUDITED_OWNERS:
            return ref
        group = (as_str(ref.get("apiVersion")) or "").rpartition("/")[0]
        if (group, kind) in crds:
            return ref
    return None


def uses_devices(obj: Mapping[str, Any]) -> bool:
    """True for what reaches the webhook at admission: DRA objects, and workloads whose pods ask for
    claims or a domain-qualified (extended) resource such as `nvidia.com/gpu`."""
    kind = as_str(obj.get("kind"))
    if kind in JUDGED_DRA_KINDS:
        return True
    for tmpl in pod_templates_of(obj):
        spec = tmpl.spec
        if as_list(spec.get("resourceClaims")):
            return True
        for key in ("containers", "initContainers"):
            for c in as_list(spec.get(key)):
                res = as_map(as_map(c).get("resources"))
                for part in ("limits", "requests"):
                    if any(isinstance(k, str) and "/" in k for k in as_map(res.get(part))):
                        return True
    return False


def auditable(
    obj: Mapping[str, Any],
    crds: frozenset[tuple[str, str]] = frozenset(),
    owners: OwnerIndex | None = None,
) -> bool:
    """Judged by the audit: it uses devices, and it is not what a judged controller listed in
    `owners` made (its finding belongs on that controller). An ownerReference alone proves nothing:
    anyone who creates an object writes it. Call within `using_crd_table` of the policies in force,
    so that workload CRDs are read."""
    if not uses_devices(obj):
        return False
    ref = controller_of(obj, crds)
    return ref is None or owners is None or not owners.made_by_owner(obj, ref)


def audit_context(
    namespace_labels: Mapping[str, Mapping[str, str]],
    served_versions: frozenset[str] = ALL_RESOURCE_VERSIONS,
    today: dt.date | None = None,
) -> Context:
    """The engine's context for objects that already exist: judged as an UPDATE would be (quota
    counts one object against its budget; its pods are already in the live usage), with the
    cluster's namespace labels."""
    return Context(
        namespace_labels=namespace_labels,
        served_versions=served_versions,
        operation="UPDATE",
        today=today or dt.date.today(),
    )


def subject_of(obj: Mapping[str, Any]) -> Subject:
    meta = as_map(obj.get("metadata"))
    return Subject(
        api_version=as_str(obj.get("apiVersion")) or "",
        kind=as_str(obj.get("kind")) or "",
        namespace=namespace_of(obj),
        name=as_str(meta.get("name")) or "",
        uid=as_str(meta.get("uid")) or "",
    )


def judge(
    objects: Sequence[Mapping[str, Any]], policies: PolicySet, inventory: Inventory, ctx: Context
) -> Iterator[Result]:
    """Results for a batch of auditable objects: each finding, and one pass per clean object."""
    items = [SourceObject(o) for o in objects]
    report = evaluate(items, policies, inventory, ctx)
    subjects: dict[tuple[str, str | None, str], Subject] = {}
    for o in objects:
        s = subject_of(o)
        subjects[(s.kind, s.namespace, s.name)] = s
    flagged: set[tuple[str, str | None, str]] = set()
    for f in report.findings:
        key = (f.object.kind, f.object.namespace, f.object.name)
        subject = subjects.get(key) or Subject(
            f.object.api_version, f.object.kind, f.object.namespace, f.object.name
        )
        flagged.add(key)
        yield result_of(f, subject)
    for key, s in subjects.items():
        if key not in flagged:
            yield passed(s)
