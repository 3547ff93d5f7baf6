"""Deeply nested user data never exhausts the stack: the engine reports it, migration copies it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.robustness.conftest import POLICIES, run_review
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import MAX_DEPTH, evaluate, too_deep
from webhook.engine.migration import copy_data, plan_workload
from webhook.policy.model import PolicySet


def _nest(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth):
        node["n"] = [{}]
        node = node["n"][0]
    return root


def _pod(**extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", **extra},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }


def _migrate_policy(policies: PolicySet) -> Any:
    return next(p for p in policies.all() if type(p).__name__ == "MigrationPolicy")


def test_copy_data_is_iterative_and_keeps_sharing() -> None:
    deep = _nest(sys.getrecursionlimit() * 3)
    copied = copy_data(deep)
    depth, a, b = 0, copied, deep
    while a:  # compare level by level (== would recurse)
        assert a is not b and list(a) == ["n"] and a["n"] is not b["n"]
        a, b, depth = a["n"][0], b["n"][0], depth + 1
    assert depth == sys.getrecursionlimit() * 3
    shared: list[Any] = [1]
    for _ in range(40):  # 2**40 leaves when expanded
        shared = [shared, shared]
    out = copy_data({"x": shared})
    assert out["x"][0] is out["x"][1] and out["x"] is not shared


def test_too_deep_finds_the_pointer() -> None:
    assert too_deep(_pod(), MAX_DEPTH) is None
    pointer = too_deep(_pod(annotations={"a": _nest(200)}), MAX_DEPTH)
    assert pointer is not None and pointer.startswith("/metadata/annotations/a/n/0/n/0")


def test_migration_plans_a_pod_with_a_deep_annotation(policies: PolicySet) -> None:
    pod = _pod(annotations={"a": _nest(3000)})
    plan = plan_workload(pod, _migrate_policy(policies), namespace="team-a")
    assert plan is not None and plan.edits
    rewritten = plan.rewritten
    assert rewritten["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith("draguard-")
    assert pod["spec"].get("resourceClaims") is None  # the source is untouched


def test_engine_reports_a_too_deep_object(policies: PolicySet, inventory: Inventory) -> None:
    item = SourceObject(obj=_pod(annotations={"a": _nest(900)}), file="p.yaml", line=1, doc_index=0, lines={})
    ctx = Context(admission=True, namespace_labels={"team-a": {"draguard.io/migration-mode": "migrate"}})
    report = evaluate([item], policies, inventory, ctx)
    rules = [f.rule for f in report.findings]
    assert rules == ["structure/too-deep"], report.findings
    assert "/metadata/annotations/a" in report.findings[0].message


def test_engine_still_migrates_below_the_limit(policies: PolicySet, inventory: Inventory) -> None:
    item = SourceObject(obj=_pod(annotations={"a": _nest(40)}), file="p.yaml", line=1, doc_index=0, lines={})
    ctx = Context(admission=True, namespace_labels={"team-a": {"draguard.io/migration-mode": "migrate"}})
    report = evaluate([item], policies, inventory, ctx)
    migrate = [f for f in report.findings if f.rule == "migrate/legacy-gpu"]
    assert migrate and migrate[0].patch, report.findings


def test_review_of_a_deep_pod(tmp_path: Path, inventory_path: Path) -> None:
    f = tmp_path / "deep.json"
    f.write_text(json.dumps(_pod(annotations={"a": _nest(300)})))
    run = run_review(
        [str(f), "--policies", str(POLICIES), "--inventory", str(inventory_path), "--format", "json"]
    )
    assert run.code == 1, run.err
    report = json.loads(run.out)
    assert [x["rule"] for x in report["findings"]] == ["structure/too-deep"]
