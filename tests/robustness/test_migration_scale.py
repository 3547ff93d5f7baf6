"""Migration planning of pods with thousands of containers, whatever their names (its time as the
count grows is a figure of bench/migration.py, not asserted here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.robustness.conftest import POLICIES, run_review
from webhook.engine.migration import plan_workload
from webhook.policy.model import MigrationPolicy, PolicySet


def _pod(n: int, *, same_name: bool) -> dict[str, Any]:
    containers = [
        {
            "name": "c" if same_name else f"c{i}",
            "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        }
        for i in range(n)
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": containers}}  # fmt: skip


def _policy(policies: PolicySet) -> MigrationPolicy:
    return next(p for p in policies.all() if isinstance(p, MigrationPolicy))


@pytest.mark.parametrize("same_name", [False, True], ids=["distinct-names", "one-name"])
def test_planning_3000_containers_gives_each_its_own_claim(policies: PolicySet, same_name: bool) -> None:
    plan = plan_workload(_pod(3000, same_name=same_name), _policy(policies), namespace="team-a")
    assert plan is not None and len(plan.edits) == 3000
    names = [e.claim_name for e in plan.edits]
    assert len(set(names)) == 3000  # every container gets its own claim
    if same_name:
        assert names[:3] == ["c-gpu", "c-gpu-2", "c-gpu-3"]
    assert len(plan.templates) == 1


def test_review_of_3000_containers(tmp_path: Path, inventory_path: Path) -> None:
    f = tmp_path / "many.yaml"
    f.write_text(yaml.safe_dump(_pod(3000, same_name=True)))
    run = run_review(
        [str(f), "--policies", str(POLICIES), "--inventory", str(inventory_path), "--format", "json"]
    )
    # 3,000 device-plugin GPUs are over the namespace's budget (quota charges them); nothing else denies.
    assert run.code == 1, run.err
    denied = {f["rule"] for f in json.loads(run.out)["findings"] if f["mode"] == "enforce"}
    assert denied == {"quota/team-budgets"}, denied
    assert "migrate/legacy-gpu" in run.out
