"""Report building: findings -> PolicyReport / ClusterPolicyReport objects, split and capped."""

from __future__ import annotations

import json

import pytest

from webhook.audit.report import (
    OMITTED_ANNOTATION,
    PARTS_ANNOTATION,
    Collector,
    Result,
    Subject,
    build_reports,
    outcome_of,
    passed,
    policy_of,
    result_of,
)
from webhook.core.findings import Finding, Mode, ObjectRef, Severity

DEP = Subject("apps/v1", "Deployment", "team-a", "llm", uid="u-1")


def finding(rule: str, mode: Mode, obj: ObjectRef | None = None, message: str = "wrong class") -> Finding:
    return Finding(
        rule=rule,
        severity=Severity.ERROR if mode is Mode.ENFORCE else Severity.WARNING,
        mode=mode,
        object=obj or ObjectRef("apps/v1", "Deployment", "team-a", "llm"),
        message=message,
        fix="use gpu.nvidia.com-h100",
    )


def test_outcome_follows_the_admission_mode() -> None:
    assert outcome_of(finding("tier/gpu-tiers", Mode.ENFORCE)) == "fail"
    assert outcome_of(finding("cel/no-match", Mode.WARN)) == "warn"
    assert outcome_of(finding("migrate/legacy-gpu", Mode.AUDIT)) == "warn"
    excepted = finding(
        "tier/gpu-tiers", Mode.AUDIT, message="x [excepted by PolicyException e until 2030-01-01]"
    )
    assert outcome_of(excepted) == "skip"
    assert outcome_of(finding("internal/tier", Mode.ENFORCE)) == "error"


def test_policy_names_the_policy_document_where_the_rule_does() -> None:
    assert policy_of("tier/gpu-tiers") == ("gpu-tiers", "tier")
    assert policy_of("quota/team-budgets") == ("team-budgets", "quota")
    assert policy_of("cel/no-match") == ("cel", "cel")
    assert policy_of("structure/invalid") == ("structure", "structure")


def test_one_namespace_report_and_one_cluster_report() -> None:
    c = Collector()
    c.add(result_of(finding("tier/gpu-tiers", Mode.ENFORCE), DEP))
    c.add(passed(Subject("apps/v1", "Deployment", "team-a", "ok", uid="u-2")))
    cls = Subject("resource.k8s.io/v1", "DeviceClass", None, "typo")
    c.add(
        result_of(
            finding(
                "cel/unknown-attribute",
                Mode.WARN,
                ObjectRef("resource.k8s.io/v1", "DeviceClass", None, "typo"),
            ),
            cls,
        )
    )
    reports = build_reports(c, timestamp=1_700_000_000)
    assert [(r["kind"], r["metadata"]["name"], r["metadata"].get("namespace")) for r in reports] == [
        ("ClusterPolicyReport", "draguard-audit", None),
        ("PolicyReport", "draguard-audit", "team-a"),
    ]
    cluster, ns = reports
    assert cluster["apiVersion"] == ns["apiVersion"] == "wgpolicyk8s.io/v1alpha2"
    assert ns["scope"] == {"apiVersion": "v1", "kind": "Namespace", "name": "team-a"}
    assert ns["summary"] == {"pass": 1, "fail": 1, "warn": 0, "error": 0, "skip": 0}
    assert cluster["summary"] == {"pass": 0, "fail": 0, "warn": 1, "error": 0, "skip": 0}
    fail = ns["results"][0]  # most severe first
    assert fail == {
        "source": "draguard",
        "policy": "gpu-tiers",
        "rule": "tier/gpu-tiers",
        "result": "fail",
        "severity": "high",
        "scored": True,
        "message": "wrong class",
        "timestamp": {"seconds": 1_700_000_000, "nanos": 0},
        "category": "tier",
        "resources": [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": "llm",
                "namespace": "team-a",
                "uid": "u-1",
            }
        ],
        "properties": {"mode": "enforce", "fix": "use gpu.nvidia.com-h100"},
    }
    assert ns["results"][1]["result"] == "pass"
    assert ns["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "draguard-audit"}
    assert ns["metadata"]["annotations"] == {PARTS_ANNOTATION: "1/1", OMITTED_ANNOTATION: "0"}


def test_results_split_into_parts_whose_summaries_add_up() -> None:
    c = Collector()
    for i in range(5):
        c.add(
            result_of(
                finding("tier/gpu-tiers", Mode.ENFORCE), Subject("apps/v1", "Deployment", "ns", f"d{i}")
            )
        )
    reports = build_reports(c, 1, max_results=2)
    assert [r["metadata"]["name"] for r in reports] == [
        "draguard-audit",
        "draguard-audit-2",
        "draguard-audit-3",
    ]
    assert [len(r["results"]) for r in reports] == [2, 2, 1]
    assert sum(r["summary"]["fail"] for r in reports) == 5
    assert [r["metadata"]["annotations"][PARTS_ANNOTATION] for r in reports] == ["1/3", "2/3", "3/3"]


def test_cap_keeps_the_most_severe_results_and_says_how_many_it_left_out() -> None:
    c = Collector()
    for i in range(6):
        c.add(passed(Subject("v1", "Pod", "ns", f"p{i}")))
    c.add(result_of(finding("tier/gpu-tiers", Mode.ENFORCE), Subject("apps/v1", "Deployment", "ns", "bad")))
    [rep] = build_reports(c, 1, max_results=3, max_parts=1)
    assert [r["result"] for r in rep["results"]] == ["fail", "pass", "pass"]
    assert rep["metadata"]["annotations"][OMITTED_ANNOTATION] == "4"
    # The summary still counts every result.
    assert rep["summary"] == {"pass": 6, "fail": 1, "warn": 0, "error": 0, "skip": 0}


def test_reports_stay_under_the_byte_limit_with_huge_messages() -> None:
    c = Collector()
    for i in range(200):
        c.add(
            result_of(
                finding("cel/no-match", Mode.WARN, message="x" * 100_000), Subject("v1", "Pod", "ns", f"p{i}")
            )
        )
    reports = build_reports(c, 1, max_bytes=64 * 1024, max_parts=100)
    assert all(len(r["results"][0]["message"]) == 1024 for r in reports)
    for r in reports:
        assert len(json.dumps(r)) < 64 * 1024 + 4096
    assert sum(len(r["results"]) for r in reports) == 200


def test_collector_holds_a_bounded_number_of_results_but_counts_all() -> None:
    c = Collector(keep=3)
    for i in range(1000):
        c.add(passed(Subject("v1", "Pod", "ns", f"p{i}")))
    scope = c.scopes["ns"]
    assert len(scope.kept["pass"]) == 3
    assert scope.counts["pass"] == 1000
    [rep] = build_reports(c, 1)
    assert rep["summary"]["pass"] == 1000
    assert rep["metadata"]["annotations"][OMITTED_ANNOTATION] == "997"


def test_an_expired_exception_is_reported_once_in_the_cluster_report() -> None:
    c = Collector()
    exc = ObjectRef("policy.draguard.io/v1alpha1", "PolicyException", None, "old")
    f = finding("exception/expired", Mode.AUDIT, exc, "PolicyException old expired on 2020-01-01")
    subject = Subject(exc.api_version, exc.kind, None, exc.name)
    for _ in range(3):  # every evaluation of a scan reports it
        c.add(result_of(f, subject))
    [rep] = build_reports(c, 1)
    assert rep["kind"] == "ClusterPolicyReport"
    assert rep["summary"]["warn"] == 1


def test_violations_count_by_rule_and_result() -> None:
    c = Collector(keep=1)
    for i in range(4):
        c.add(
            result_of(
                finding("tier/gpu-tiers", Mode.ENFORCE), Subject("apps/v1", "Deployment", "ns", f"d{i}")
            )
        )
    c.add(result_of(finding("cel/no-match", Mode.WARN), DEP))
    c.add(passed(DEP))
    assert c.violations() == {("tier/gpu-tiers", "fail"): 4, ("cel/no-match", "warn"): 1}


def test_unknown_result_is_refused() -> None:
    with pytest.raises(ValueError, match="maybe"):
        Collector().add(Result("p", "r", "maybe", "info", "m", None))
