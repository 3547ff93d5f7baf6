"""Findings -> `wgpolicyk8s.io/v1alpha2` PolicyReport and ClusterPolicyReport objects. Pure.

One report per namespace (named `draguard-audit`) and one ClusterPolicyReport for cluster-scoped
objects. A report is split into parts (`draguard-audit`, `draguard-audit-2`, ...) so that no object
nears the API server's request limit (etcd refuses objects over 1.5 MiB); past `max_parts` parts the
least severe results are left out. The first part's summary also counts the results left out (so
the parts' summaries add up to every result), and its annotation `draguard.io/results-omitted` says
how many were; `draguard.io/report-parts` says "part/parts".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.findings import Finding, Mode, Severity

API_VERSION = "wgpolicyk8s.io/v1alpha2"
REPORT_NAME = "draguard-audit"
SOURCE = "draguard"
MANAGED_BY = "draguard-audit"
LABELS = {"app.kubernetes.io/managed-by": MANAGED_BY}
OMITTED_ANNOTATION = "draguard.io/results-omitted"
PARTS_ANNOTATION = "draguard.io/report-parts"

RESULTS = ("fail", "error", "warn", "skip", "pass")  # most severe first: what a cap keeps
SEVERITY = {Severity.ERROR: "high", Severity.WARNING: "medium", Severity.INFO: "info"}
MAX_MESSAGE = 1024
MAX_PROPERTY = 512
DEFAULT_MAX_RESULTS = 1000
# Well under the API server's 3 MiB request limit and etcd's 1.5 MiB object limit.
DEFAULT_MAX_BYTES = 768 * 1024
DEFAULT_MAX_PARTS = 5
EXCEPTED_MARK = "[excepted by PolicyException "


@dataclass(frozen=True, slots=True)
class Subject:
    """The object a result is about (a core/v1 ObjectReference)."""

    api_version: str
    kind: str
    namespace: str | None
    name: str
    uid: str = ""

    def to_json(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass(frozen=True, slots=True)
class Result:
    policy: str
    rule: str
    result: str
    severity: str
    message: str
    subject: Subject | None
    category: str = ""
    properties: tuple[tuple[str, str], ...] = ()

    def to_json(self, timestamp: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": SOURCE,
            "policy": self.policy,
            "rule": self.rule,
            "result": self.result,
            "severity": self.severity,
            "scored": True,
            "message": self.message,
            "timestamp": {"seconds": timestamp, "nanos": 0},
        }
        if self.category:
            out["category"] = self.category
        if self.subject is not None:
            out["resources"] = [self.subject.to_json()]
        if self.properties:
            out["properties"] = dict(self.properties)
        return out


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def outcome_of(f: Finding) -> str:
    """The PolicyReport result for a finding: enforce -> fail, warn -> warn, a finding a live
    PolicyException covers -> skip, other audit-mode records -> warn, a rule that failed -> error."""
    if f.rule.startswith("internal/"):
        return "error"
    if f.mode is Mode.ENFORCE:
        return "fail"
    if f.mode is Mode.AUDIT and EXCEPTED_MARK in f.message:
        return "skip"
    return "warn"


def policy_of(rule: str) -> tuple[str, str]:
    """(policy, category) of a rule id: `tier/gpu-tiers` -> ("gpu-tiers", "tier") (the rule names its
    policy document), `cel/no-match` -> ("cel", "cel") (a check of its own)."""
    family, _, rest = rule.partition("/")
    if family in ("tier", "quota") and rest:
        return rest, family
    return family, family


def result_of(f: Finding, subject: Subject | None) -> Result:
    policy, category = policy_of(f.rule)
    props: list[tuple[str, str]] = [("mode", f.mode.value)]
    if f.fix:
        props.append(("fix", _cut(f.fix, MAX_PROPERTY)))
    return Result(
        policy=policy,
        rule=f.rule,
        result=outcome_of(f),
        severity=SEVERITY.get(f.severity, "info"),
        message=_cut(f.message, MAX_MESSAGE),
        subject=subject,
        category=category,
        properties=tuple(props),
    )


def passed(subject: Subject) -> Result:
    """The one result of an audited object no rule had anything to say about."""
    return Result(
        policy="draguard",
        rule="all",
        result="pass",
        severity="info",
        message="no draguard rule found a problem",
        subject=subject,
        category="draguard",
    )


@dataclass
class _Scope:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS, 0))
    kept: dict[str, list[Result]] = field(default_factory=lambda: {r: [] for r in RESULTS})
    dropped: int = 0
    by_rule: dict[tuple[str, str], int] = field(default_factory=dict)


class Collector:
    """Results per scope (a namespace, or None for the cluster), bounded: per scope and result type
    at most `keep` results are held; every result is counted."""

    def __init__(self, keep: int = DEFAULT_MAX_RESULTS * DEFAULT_MAX_PARTS) -> None:
        self.keep = keep
        self.scopes: dict[str | None, _Scope] = {}
        self.by_rule: dict[tuple[str, str], int] = {}
        self._seen: set[tuple[Any, ...]] = set()

    def add(self, r: Result) -> None:
        if r.result not in RESULTS:
            raise ValueError(f"unknown result {r.result!r}")
        s = r.subject
        ns = s.namespace if s is not None else None
        if s is None or s.kind == "PolicyException":
            ns = None
        key = (r.rule, r.message, s)
        if key in self._seen:  # expired exceptions are reported by every evaluation
            return
        if s is None or s.kind == "PolicyException":
            self._seen.add(key)
        scope = self.scopes.setdefault(ns, _Scope())
        scope.counts[r.result] += 1
        if r.result in ("fail", "error", "warn"):
            self.by_rule[(r.rule, r.result)] = self.by_rule.get((r.rule, r.result), 0) + 1
            scope.by_rule[(r.rule, r.result)] = scope.by_rule.get((r.rule, r.result), 0) + 1
        kept = scope.kept[r.result]
        if len(kept) < self.keep:
            kept.append(r)
        else:
            scope.dropped += 1

    def extend(self, results: Iterable[Result]) -> None:
        for r in results:
            self.add(r)

    def violations(self) -> dict[tuple[str, str], int]:
        """(rule, result) -> count over every scope, for fail, error and warn results."""
        return dict(self.by_rule)


def _sort_key(r: Result) -> tuple[Any, ...]:
    s = r.subject
    return (RESULTS.index(r.result), s.kind if s else "", s.name if s else "", r.rule, r.message)


def build_reports(
    collector: Collector,
    timestamp: int,
    *,
    max_results: int = DEFAULT_MAX_RESULTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_parts: int = DEFAULT_MAX_PARTS,
) -> list[dict[str, Any]]:
    """Every report object for the collected results, parts of a scope in order."""
    out: list[dict[str, Any]] = []
    for ns in sorted(collector.scopes, key=lambda n: (n is not None, n or "")):
        out.extend(scope_reports(ns, collector.scopes[ns], timestamp, max_results, max_bytes, max_parts))
    return out


def scope_reports(
    namespace: str | None,
    scope: _Scope,
    timestamp: int,
    max_results: int,
    max_bytes: int,
    max_parts: int,
) -> list[dict[str, Any]]:
    ordered = sorted((r for res in RESULTS for r in scope.kept[res]), key=_sort_key)
    parts: list[list[dict[str, Any]]] = [[]]
    size = 0
    omitted = scope.dropped
    for i, r in enumerate(ordered):
        entry = r.to_json(timestamp)
        n = len(json.dumps(entry, separators=(",", ":"))) + 1
        if parts[-1] and (len(parts[-1]) >= max_results or size + n > max_bytes):
            if len(parts) >= max_parts:
                omitted += len(ordered) - i
                break
            parts.append([])
            size = 0
        parts[-1].append(entry)
        size += n
    summaries = []
    for results in parts:
        summary = dict.fromkeys(RESULTS, 0)
        for e in results:
            summary[e["result"]] += 1
        summaries.append(summary)
    # Results left out are counted in the first part: summed over the parts, the summaries count
    # every result of the scope (consumers such as Policy Reporter add summaries up).
    for res in RESULTS:
        summaries[0][res] += scope.counts[res] - sum(s[res] for s in summaries)
    return [
        _report(namespace, idx, len(parts), results, summaries[idx], omitted if idx == 0 else 0)
        for idx, results in enumerate(parts)
    ]


def part_name(index: int) -> str:
    return REPORT_NAME if index == 0 else f"{REPORT_NAME}-{index + 1}"


def _report(
    namespace: str | None,
    index: int,
    parts: int,
    results: list[dict[str, Any]],
    summary: Mapping[str, int],
    omitted: int,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": part_name(index), "labels": dict(LABELS)}
    annotations = {PARTS_ANNOTATION: f"{index + 1}/{parts}"}
    if index == 0:
        annotations[OMITTED_ANNOTATION] = str(omitted)
    meta["annotations"] = annotations
    rep: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "PolicyReport" if namespace is not None else "ClusterPolicyReport",
        "metadata": meta,
    }
    if namespace is not None:
        meta["namespace"] = namespace
        rep["scope"] = {"apiVersion": "v1", "kind": "Namespace", "name": namespace}
    rep["summary"] = {k: int(summary.get(k, 0)) for k in ("pass", "fail", "warn", "error", "skip")}
    rep["results"] = results
    return rep
