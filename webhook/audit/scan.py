"""One audit scan: read the cluster, judge every auditable object, build the reports."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..dra.workloads import using_crd_table
from ..policy.model import PolicySet
from ..server.caches import KubeHttp
from .evaluate import audit_context, auditable, judge, uses_devices
from .owners import OwnerIndex
from .report import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_PARTS,
    DEFAULT_MAX_RESULTS,
    Collector,
    Result,
    Subject,
    build_reports,
)
from .source import (
    BUILTIN,
    ClusterState,
    Collection,
    crd_collections,
    judged_pages,
    read_state,
    refresh_namespace,
)


@dataclass(frozen=True)
class Limits:
    max_results: int = DEFAULT_MAX_RESULTS
    max_bytes: int = DEFAULT_MAX_BYTES
    max_parts: int = DEFAULT_MAX_PARTS


@dataclass
class ScanOutcome:
    reports: list[dict[str, Any]]
    collector: Collector
    objects: int  # objects judged
    seconds: float
    state: ClusterState | None = None


def judge_pages(
    pages: Iterable[list[dict[str, Any]]],
    policies: PolicySet,
    state: ClusterState,
    limits: Limits = Limits(),
    timestamp: int | None = None,
    after: Callable[[], Iterable[Result]] = lambda: (),
) -> ScanOutcome:
    """Judge pages of objects (already filtered by `auditable`) and build their reports, with the
    results `after()` gives once the pages are read."""
    start = time.monotonic()
    ctx = audit_context(state.namespace_labels, state.served_versions or frozenset({"v1"}))
    collector = Collector(keep=limits.max_results * limits.max_parts)
    objects = 0
    for page in pages:
        objects += len(page)
        collector.extend(judge(page, policies, state.inventory, ctx))
    collector.extend(after())
    reports = build_reports(
        collector,
        int(time.time()) if timestamp is None else timestamp,
        max_results=limits.max_results,
        max_bytes=limits.max_bytes,
        max_parts=limits.max_parts,
    )
    return ScanOutcome(reports, collector, objects, time.monotonic() - start)


def unlisted_result(c: Collection, reason: str) -> Result:
    """An error in the ClusterPolicyReport for a workload CRD the audit may not list."""
    return Result(
        policy="draguard",
        rule="audit/cannot-list",
        result="error",
        severity="high",
        message=(
            f"the audit cannot list {c.resource}.{c.group} ({reason[:300]}), so {c.kind} objects are "
            f"not judged: grant the draguard-audit ClusterRole list and watch on {c.resource} in "
            f"API group {c.group}"
        ),
        subject=Subject(c.group_version, "CustomResourceDefinition", None, f"{c.resource}.{c.group}"),
        category="draguard",
    )


def owner_filter(
    policies: PolicySet,
    state: ClusterState,
    crds: Callable[[], frozenset[tuple[str, str]]],
    namespace: str | None = None,
) -> tuple[Callable[[Mapping[str, Any]], bool], OwnerIndex]:
    """`keep` for the objects of one scan (of the cluster, or of `namespace`), in the order listed
    (owners before what they make), and the index of owners it builds as it goes: an object is left
    to its named owner only when that owner was listed, or deleted a moment ago, and would make it."""
    owners = OwnerIndex(policies, state.dra_objects, previous=state.owners, namespace=namespace)

    def keep(obj: Mapping[str, Any]) -> bool:
        if not uses_devices(obj):
            return False  # nor does what a template of it makes: no owner to keep
        owners.add(obj)
        return auditable(obj, crds(), owners)

    return keep, owners


def _judge(
    http: KubeHttp,
    policies: PolicySet,
    state: ClusterState,
    limits: Limits,
    namespace: str | None = None,
) -> ScanOutcome:
    unlisted: list[tuple[Collection, str]] = []
    crds = frozenset((c.group, c.kind) for c in state.collections if c.crd)
    # A CRD that could not be listed is not judged, so its pods are judged themselves.
    keep, owners = owner_filter(
        policies, state, lambda: crds.difference((c.group, c.kind) for c, _ in unlisted), namespace
    )
    pages = judged_pages(
        http, state, keep, namespace=namespace, collections=state.collections, unlisted=unlisted
    )
    out = judge_pages(
        pages, policies, state, limits, after=lambda: [unlisted_result(c, why) for c, why in unlisted]
    )
    if namespace is None:
        state.owners = owners
    else:
        state.owners.replace_namespace(namespace, owners)
    return out


def scan_cluster(
    http: KubeHttp, policies: PolicySet, limits: Limits = Limits(), owners: OwnerIndex | None = None
) -> ScanOutcome:
    """Judge the whole cluster. `owners`: the last scan's index, so that owners deleted since still
    vouch for what they made (owners.RECENT_SECONDS)."""
    start = time.monotonic()
    with using_crd_table(policies.crd_table):
        state = read_state(http)
        if owners is not None:
            state.owners = owners
        crds = crd_collections(http, policies.crd_table)
        state.collections = (*crds, *BUILTIN)
        out = _judge(http, policies, state, limits)
    out.seconds = time.monotonic() - start
    out.state = state
    return out


def scan_namespace(
    http: KubeHttp, policies: PolicySet, state: ClusterState, namespace: str, limits: Limits = Limits()
) -> ScanOutcome:
    """Judge one namespace again, as a full scan would (its labels, claims and templates re-read;
    the rest of `state`, with the collections listed, as the last full scan left it). Only that
    namespace's reports come out."""
    start = time.monotonic()
    with using_crd_table(policies.crd_table):
        refresh_namespace(http, state, namespace)
        out = _judge(http, policies, state, limits, namespace)
    out.reports = [r for r in out.reports if (r.get("metadata") or {}).get("namespace") == namespace]
    out.seconds = time.monotonic() - start
    out.state = state
    return out


def summary_rows(reports: Iterable[Mapping[str, Any]]) -> list[tuple[str, dict[str, int]]]:
    """(scope, summary) per scope, the parts of a scope added up."""
    rows: dict[str, dict[str, int]] = {}
    for rep in reports:
        meta = rep.get("metadata") or {}
        scope = str(meta.get("namespace") or "(cluster)")
        acc = rows.setdefault(scope, dict.fromkeys(("pass", "fail", "warn", "error", "skip"), 0))
        for k, v in (rep.get("summary") or {}).items():
            acc[k] = acc.get(k, 0) + int(v)
    return sorted(rows.items())
