"""Each checklist item passes, fails or is unknown on the evidence, and says why."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from webhook.assess.checklist import SECTIONS, checklist, server_minor
from webhook.policy.model import PolicySet

GOOD: dict[str, Any] = {
    "server": {"gitVersion": "v1.37.2"},
    "dra": {"served": ["v1", "v1beta2"]},
    "drivers": [
        {
            "driver": "gpu.nvidia.com",
            "slices": 2,
            "devices": 8,
            "byNode": {"n1": 4, "n2": 4},
            "byModel": {"NVIDIA H100 80GB HBM3": 8},
        }
    ],
    "devicesByModel": {"NVIDIA H100 80GB HBM3": 8},
    "daemonSets": [
        {
            "kind": "draguard-driver",
            "namespace": "draguard-system",
            "name": "draguard-driver",
            "images": [],
            "desired": 2,
            "ready": 2,
        }
    ],
    "nodes": [],
    "deviceClasses": [
        {
            "name": "gpu.nvidia.com-h100",
            "devices": 8,
            "allocated": 2,
            "models": {"NVIDIA H100 80GB HBM3": 8},
            "lint": [],
        }
    ],
    "claims": {"total": 2, "allocated": 2, "pending": 0, "pendingOver5m": 0, "reservedForMissingPods": []},
    "pods": {"total": 10, "legacy": 0, "dra": 2},
    "gpuUse": {"legacy": 0, "dra": 2},
    "legacyWorkloads": [],
    "legacyWorkloadCount": 0,
    "wouldDeny": [],
    "wouldDenyCount": 0,
    "orphanSlices": [],
    "unreadable": {},
    "extras": {
        "webhooks": ["draguard-validate", "draguard-mutate"],
        "admissionPolicies": ["draguard-namespace-labels"],
        "monitoringApi": True,
        "serviceMonitors": ["draguard-system/draguard-driver"],
    },
}


def _status(a: dict[str, Any], policies: PolicySet) -> dict[str, str]:
    return {i["id"]: i["status"] for i in checklist(a, policies, {})}


def test_a_healthy_dra_cluster_passes_every_observable_item(policies: PolicySet) -> None:
    items = checklist(GOOD, policies, {})
    assert {i["section"] for i in items} == {k for k, _ in SECTIONS}
    not_pass = {i["id"]: i["status"] for i in items if i["status"] != "pass"}
    # Allocation latency is only on the driver's metrics: never claimed from the API.
    assert not_pass == {"performance/allocation-latency": "unknown"}
    assert all(i["evidence"] for i in items)


@pytest.mark.parametrize(
    ("change", "item", "status"),
    [
        (lambda a: a["server"].update(gitVersion="v1.31.4"), "infrastructure/version", "fail"),
        (lambda a: a["server"].update(gitVersion="weird"), "infrastructure/version", "unknown"),
        (lambda a: a["dra"].update(served=[]), "infrastructure/dra-api", "fail"),
        (lambda a: a.update(drivers=[]), "infrastructure/driver", "fail"),
        (lambda a: a["unreadable"].update(resourceslices="403"), "infrastructure/driver", "unknown"),
        (lambda a: a["daemonSets"][0].update(ready=1), "infrastructure/driver-ready", "fail"),
        (lambda a: a.update(daemonSets=[]), "infrastructure/driver-ready", "unknown"),
        (
            lambda a: a.update(
                nodes=[
                    {
                        "name": "n1",
                        "model": "x",
                        "capacity": {"nvidia.com/gpu": "4"},
                        "allocatable": {"nvidia.com/gpu": "4"},
                    }
                ]
            ),
            "infrastructure/coexistence",
            "fail",
        ),
        (lambda a: a.update(deviceClasses=[]), "deviceclasses/exist", "fail"),
        (
            lambda a: a["deviceClasses"].append({"name": "typo", "devices": 0, "lint": []}),
            "deviceclasses/match",
            "fail",
        ),
        (lambda a: a["devicesByModel"].update({"NVIDIA A100": 2}), "deviceclasses/models", "fail"),
        (
            lambda a: a["deviceClasses"][0]["lint"].append(
                {"rule": "cel/unknown-attribute", "severity": "error", "message": "m"}
            ),
            "deviceclasses/cel",
            "fail",
        ),
        (
            lambda a: a.update(
                legacyWorkloadCount=1,
                legacyWorkloads=[
                    {
                        "owner": {"kind": "Deployment", "namespace": "ml", "name": "d"},
                        "migration": {"status": "denied after migration"},
                    }
                ],
            ),
            "workloads/migratable",
            "fail",
        ),
        (lambda a: a.update(legacyWorkloadCount=1), "workloads/legacy", "fail"),
        (
            lambda a: a.update(
                wouldDeny=[
                    {
                        "owner": {"kind": "Deployment", "namespace": "ml", "name": "d"},
                        "deny": [{"rule": "tier/gpu-tiers"}],
                    }
                ]
            ),
            "workloads/policy",
            "fail",
        ),
        (lambda a: a["extras"].update(webhooks=[]), "security/admission", "fail"),
        (lambda a: a["extras"].update(webhooks=None), "security/admission", "unknown"),
        (lambda a: a["extras"].update(admissionPolicies=[]), "security/label-guard", "fail"),
        (lambda a: a["claims"].update(pendingOver5m=3), "monitoring/pending-claims", "fail"),
        (lambda a: a["deviceClasses"][0].update(allocated=8), "monitoring/availability", "fail"),
        (lambda a: a["extras"].update(serviceMonitors=[]), "monitoring/metrics", "fail"),
        (lambda a: a["extras"].update(monitoringApi=False), "monitoring/metrics", "unknown"),
        (lambda a: a["claims"].update(reservedForMissingPods=["ml/c"]), "incidents/leaked-claims", "fail"),
        (lambda a: a.update(orphanSlices=["old-node"]), "incidents/orphan-slices", "fail"),
    ],
)
def test_each_item_fails_on_its_evidence(change: Any, item: str, status: str, policies: PolicySet) -> None:
    a = copy.deepcopy(GOOD)
    change(a)
    got = _status(a, policies)
    assert got[item] == status
    # One change moves its item and those that need the same evidence (no devices: nothing to
    # match or count free), never the whole list.
    assert sum(v != "pass" for v in got.values()) <= 4


def test_namespaces_without_a_budget_fail_the_quota_item(policies: PolicySet) -> None:
    a = copy.deepcopy(GOOD)
    a["wouldDeny"] = [
        {
            "owner": {"kind": "Deployment", "namespace": "kube-system", "name": "d"},
            "deny": [{"rule": "tier/x"}],
        }
    ]
    assert _status(a, PolicySet.empty())["workloads/quota"] == "fail"
    # The shipped policies give every namespace the default budget.
    assert _status(a, policies)["workloads/quota"] == "pass"


def test_managed_cluster_versions_parse() -> None:
    assert server_minor({"gitVersion": "v1.33.5-eks-113cf36"}) == (1, 33)
    assert server_minor({"major": "1", "minor": "32+"}) == (1, 32)
    assert server_minor({}) is None
