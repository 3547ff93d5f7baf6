"""What the audit judges and how, through the admission engine, on the shipped policies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.audit.evaluate import audit_context, auditable, judge
from webhook.audit.owners import OwnerIndex
from webhook.audit.report import Collector, build_reports
from webhook.audit.scan import judge_pages
from webhook.audit.source import ClusterState, trim
from webhook.dev import scenarios
from webhook.dra.inventory import Inventory, load_inventory
from webhook.policy.load import load_policies
from webhook.policy.model import PolicySet

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return load_policies(ROOT / "policies")


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return load_inventory(ROOT / "examples" / "inventory.yaml")


def objs(*docs: str) -> list[dict[str, Any]]:
    out = []
    for d in docs:
        for o in yaml.safe_load_all(d):
            o.setdefault("metadata", {})["uid"] = f"uid-{o['metadata']['name']}"
            out.append(o)
    return out


def state(inventory: Inventory, templates: list[dict[str, Any]]) -> ClusterState:
    return ClusterState(
        Inventory.from_objects([*_slices_and_classes(), *templates]), {"team-a": {}}, frozenset({"v1"})
    )


def _slices_and_classes() -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all((ROOT / "examples" / "inventory.yaml").read_text()) if o]


def test_llm_deployment_on_a100_fails_its_tier_on_h100_passes(
    policies: PolicySet, inventory: Inventory
) -> None:
    templates = objs(
        scenarios.llm_template("team-a", scenarios.A100), scenarios.llm_template("team-a", scenarios.H100)
    )
    st = state(inventory, templates)
    work = objs(
        scenarios.llm_deployment("team-a", scenarios.A100), scenarios.llm_deployment("team-a", scenarios.H100)
    )
    out = judge_pages([templates + work], policies, st, timestamp=5)
    [rep] = [r for r in out.reports if r["metadata"].get("namespace") == "team-a"]
    by_name: dict[str, list[str]] = {}
    for r in rep["results"]:
        by_name.setdefault(r["resources"][0]["name"], []).append(f"{r['result']}:{r['rule']}")
    assert by_name["llm-inference-a100"] == ["fail:tier/gpu-tiers"]
    assert by_name["llm-inference-h100"] == ["pass:all"]
    fail = next(r for r in rep["results"] if r["result"] == "fail")
    assert fail["resources"][0]["uid"] == "uid-llm-inference-a100"
    assert "gpu.nvidia.com-a100" in fail["message"]
    assert out.objects == 4


def test_objects_made_by_an_audited_controller_are_judged_through_it() -> None:
    [dep] = objs(scenarios.llm_deployment("team-a", scenarios.A100))
    rs = {
        **dep,
        "kind": "ReplicaSet",
        "metadata": {
            "name": "rs",
            "namespace": "team-a",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": dep["metadata"]["name"],
                    "uid": dep["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
    }
    owners = OwnerIndex()
    owners.add(dep)
    assert auditable(dep, owners=owners)
    assert not auditable(rs, owners=owners)
    assert auditable(rs)  # its owner was not listed: the reference alone proves nothing
    # A controller the audit does not list (an operator's CRD) leaves its pods to be judged themselves.
    crd_owned = {
        **rs,
        "metadata": {
            **rs["metadata"],
            "ownerReferences": [
                {
                    "apiVersion": "example.com/v1",
                    "kind": "Trainer",
                    "name": "t",
                    "uid": "y",
                    "controller": True,
                }
            ],
        },
    }
    assert auditable(crd_owned, owners=owners)


def test_objects_without_devices_are_not_judged() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "a"},
        "spec": {"containers": [{"name": "c", "image": "nginx", "resources": {"limits": {"cpu": "1"}}}]},
    }
    assert not auditable(pod)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
    assert auditable(pod)


def test_a_legacy_gpu_pod_is_reported_as_a_warning_to_migrate(
    policies: PolicySet, inventory: Inventory
) -> None:
    [pod] = objs(scenarios.legacy_pod("team-a"))
    results = list(judge([pod], policies, inventory, audit_context({"team-a": {}})))
    rules = {(r.rule, r.result) for r in results}
    assert ("migrate/legacy-gpu", "warn") in rules, rules
    assert all(r.subject is not None and r.subject.name == pod["metadata"]["name"] for r in results)


def test_an_existing_object_is_judged_alone_against_its_budget(
    policies: PolicySet, inventory: Inventory
) -> None:
    """Judged as an UPDATE: a claim over its namespace's budget fails; usage is not counted twice."""
    [claim] = objs(scenarios.big_a100_claim("team-x", count=9))
    c = Collector()
    c.extend(judge([claim], policies, inventory, audit_context({"team-x": {}})))
    [rep] = build_reports(c, 1)
    assert any(r["result"] == "fail" and r["rule"].startswith("quota/") for r in rep["results"]), rep[
        "results"
    ]


def test_trim_keeps_what_rules_read_and_drops_the_rest() -> None:
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "n",
            "uid": "u",
            "labels": {"a": "b"},
            "managedFields": [{"x": 1}],
            "resourceVersion": "7",
        },
        "spec": {"containers": []},
        "status": {"phase": "Running"},
    }
    assert trim(obj) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {"containers": []},
        "metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"a": "b"}},
    }
    assert trim(obj, keep_status=True)["status"] == {"phase": "Running"}


def test_trim_drops_the_last_applied_copy_of_the_object() -> None:
    notes = {"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 100_000 + "}", "team": "a"}
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": notes}, "spec": {}}
    assert trim(obj)["metadata"]["annotations"] == {"team": "a"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in notes  # the input is left as it was
