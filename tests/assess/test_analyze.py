"""The assessment of plain-data clusters: owners, migration what-ifs and today's verdicts, judged
by the engine with the shipped policies."""

from __future__ import annotations

import copy
from typing import Any

from tests.assess.conftest import (
    SLICES,
    Objects,
    assessor,
    deployment,
    owned,
    pod_of,
    pod_template,
    replicaset,
)
from webhook.policy.model import PolicySet

A100_TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"namespace": "team-a", "name": "a100"},
    "spec": {
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-a100"}}]}
        }
    },
}


def _legacy(
    ns: str = "team-a", name: str = "trainer", gpus: int = 2, replicas: int = 2, image: str = "pytorch"
) -> Any:
    return deployment(ns, name, pod_template(image, {"limits": {"nvidia.com/gpu": gpus}}), replicas=replicas)


def _llm_on_a100() -> Any:
    tmpl = pod_template(
        "vllm/vllm-openai:v0.6", claims=[{"name": "gpu", "resourceClaimTemplateName": "a100"}]
    )
    return deployment("team-a", "chat-llm", tmpl)


def _run(
    policies: PolicySet, *owners: Any, pods_per: int = 2, claims: list[Any] | None = None
) -> dict[str, Any]:
    rss = [replicaset(d) for d in owners]
    a = assessor(policies, Objects(*owners, *rss), {"team-a": {}, "dev": {"draguard.io/team": "ml"}})
    a.add_templates([copy.deepcopy(A100_TEMPLATE)])
    a.add_claims(claims or [])
    a.add_nodes([{"metadata": {"name": n}} for n in ("node1", "node2", "node3")])
    a.add_pods([pod_of(rs, i) for rs in rss for i in range(pods_per)])
    return a.result({"gitVersion": "v1.37.2"}, ["v1"])


def test_legacy_deployment_gets_its_template_tier_verdict_and_charge(policies: PolicySet) -> None:
    r = _run(policies, _legacy())
    (w,) = r["legacyWorkloads"]
    assert w["owner"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "namespace": "team-a",
        "name": "trainer",
    }
    assert w["pods"] == 2 and w["legacyGpus"] == {"nvidia.com/gpu": 4}
    m = w["migration"]
    assert m["templates"] == [
        {"name": "draguard-gpu-nvidia-com-a100-2", "deviceClass": "gpu.nvidia.com-a100", "count": 2}
    ]
    assert m["tier"]["admitted"] is True and m["status"] == "admitted after migration"
    assert m["quota"] == {
        "replicas": 2,
        "devices": {"gpu.nvidia.com-a100": 4},
        "gpuEquivalents": 4.0,
        "admitted": True,
        "findings": [],
    }
    assert r["gpuUse"]["legacy"] == 4 and r["pods"]["legacy"] == 2


def test_migration_that_breaks_the_budget_is_reported_denied(policies: PolicySet) -> None:
    # team-* budget: 8 A100s. 5 replicas x 2 GPUs = 10 after migration.
    r = _run(policies, _legacy(replicas=5), pods_per=1)
    m = r["legacyWorkloads"][0]["migration"]
    assert m["quota"]["admitted"] is False and m["quota"]["devices"] == {"gpu.nvidia.com-a100": 10}
    assert m["status"] == "denied after migration"
    assert any(f["rule"].startswith("quota/") for f in m["quota"]["findings"])


def test_llm_on_a100_is_denied_today_and_a_legacy_llm_migrates_to_h100(policies: PolicySet) -> None:
    legacy_llm = _legacy(name="old-llm", image="vllm/vllm-openai:v0.5", replicas=1, gpus=1)
    r = _run(policies, _llm_on_a100(), legacy_llm, pods_per=1)
    denied = {w["owner"]["name"]: w for w in r["wouldDeny"]}
    assert set(denied) == {"chat-llm"}
    assert denied["chat-llm"]["deny"][0]["rule"] == "tier/gpu-tiers"
    (w,) = r["legacyWorkloads"]
    # The rewrite picks a class the tier policy allows, so the migrated LLM is admitted.
    assert w["migration"]["templates"][0]["deviceClass"] == "gpu.nvidia.com-h100"
    assert w["migration"]["tier"]["admitted"] is True
    item = next(i for i in r["checklist"] if i["id"] == "workloads/policy")
    assert item["status"] == "fail" and "Deployment/team-a/chat-llm" in item["evidence"]


def test_many_pods_of_one_deployment_are_one_workload(policies: PolicySet) -> None:
    d = _legacy(replicas=300)
    rs = replicaset(d)
    look = Objects(d, rs)
    a = assessor(policies, look, {"team-a": {}})
    a.add_claims([])
    plain = [pod_of(rs, i) for i in range(300)]
    for p in plain[:100]:  # pods without GPUs are only counted
        p["spec"]["containers"][0].pop("resources")
    a.add_pods(plain)
    r = a.result({"gitVersion": "v1.37.2"}, ["v1"])
    assert len(a.workloads) == 1 and r["pods"]["total"] == 300 and r["pods"]["legacy"] == 200
    assert r["legacyWorkloads"][0]["pods"] == 200 and r["legacyWorkloads"][0]["legacyGpus"] == {
        "nvidia.com/gpu": 400
    }


def test_finished_pods_hold_nothing(policies: PolicySet) -> None:
    d = _legacy()
    rs = replicaset(d)
    a = assessor(policies, Objects(d, rs), {"team-a": {}})
    a.add_claims([])
    a.add_pods([pod_of(rs, 0, phase="Succeeded"), pod_of(rs, 1, phase="Failed")])
    r = a.result({"gitVersion": "v1.37.2"}, ["v1"])
    assert r["legacyWorkloads"] == [] and r["pods"]["finished"] == 2


def test_bare_pod_is_judged_itself(policies: PolicySet) -> None:
    a = assessor(policies, Objects(), {"team-a": {}})
    a.add_templates([copy.deepcopy(A100_TEMPLATE)])
    a.add_claims([])
    pod = {
        "metadata": {"namespace": "team-a", "name": "llm-pod", "uid": "u1"},
        "spec": _llm_on_a100()["spec"]["template"]["spec"],
        "status": {"phase": "Running"},
    }
    pod["spec"]["containers"][0]["image"] = "ollama/ollama"
    a.add_pods([pod])
    r = a.result({"gitVersion": "v1.37.2"}, ["v1"])
    (w,) = r["wouldDeny"]
    assert w["owner"]["kind"] == "Pod" and w["owner"]["name"] == "llm-pod"


def test_claims_count_allocations_and_leaks(policies: PolicySet) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": "c1", "creationTimestamp": "2020-01-01T00:00:00Z"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-h100"}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node2", "device": "gpu-0"}
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "gone", "uid": "uid-gone"}],
        },
    }
    pending = copy.deepcopy(claim)
    pending["metadata"]["name"] = "c2"
    del pending["status"]
    r = _run(policies, pods_per=0, claims=[claim, pending])
    assert r["claims"]["total"] == 2 and r["claims"]["allocated"] == 1 and r["claims"]["pending"] == 1
    assert r["claims"]["reservedForMissingPods"] == ["team-a/c1"]
    assert r["claims"]["pendingOver5m"] == 1
    assert r["gpuUse"]["dra"] == 1 and r["claims"]["allocatedByDriver"] == {"gpu.nvidia.com": 1}
    assert {"scope": "team-a", "deviceClass": "gpu.nvidia.com-h100", "devices": 2} in r["usage"]["devices"]
    status = {i["id"]: i["status"] for i in r["checklist"]}
    assert status["incidents/leaked-claims"] == "fail" and status["monitoring/pending-claims"] == "fail"


def test_device_classes_count_live_devices(policies: PolicySet) -> None:
    r = _run(policies, pods_per=0)
    by = {c["name"]: c for c in r["deviceClasses"]}
    assert by["gpu.nvidia.com-h100"]["devices"] == 8
    assert by["gpu.nvidia.com-a100"]["devices"] == 4
    assert by["gpu.nvidia.com-h200"]["devices"] == 0
    assert r["devicesByModel"] == {
        "NVIDIA A100 80GB PCIe": 4,
        "NVIDIA A100 80GB PCIe MIG 3g.20gb": 4,
        "NVIDIA H100 80GB HBM3": 8,
    }
    assert r["drivers"][0]["byNode"] == {"node1": 4, "node2": 8, "node3": 4}


def test_device_plugin_nodes_and_daemonsets(policies: PolicySet) -> None:
    a = assessor(policies, Objects(), {})
    a.add_claims([])
    a.add_nodes(
        [
            {
                "metadata": {"name": "node2", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
                "status": {
                    "capacity": {"cpu": "8", "nvidia.com/gpu": "8"},
                    "allocatable": {"nvidia.com/gpu": "8"},
                },
            },
            {"metadata": {"name": "cpu-only"}, "status": {"capacity": {"cpu": "8"}}},
        ]
    )
    ds = {
        "metadata": {"namespace": "gpu-operator", "name": "nvidia-device-plugin-daemonset"},
        "spec": {
            "template": {"spec": {"containers": [{"image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}]}}
        },
        "status": {"desiredNumberScheduled": 2, "numberReady": 2},
    }
    dra = {
        "metadata": {"namespace": "nvidia-dra-driver-gpu", "name": "kubelet-plugin"},
        "spec": {
            "template": {"spec": {"containers": [{"image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.3.0"}]}}
        },
        "status": {"desiredNumberScheduled": 3, "numberReady": 2},
    }
    other = {
        "metadata": {"namespace": "kube-system", "name": "kube-proxy"},
        "spec": {"template": {"spec": {"containers": [{"image": "kube-proxy"}]}}},
    }
    a.add_daemonsets([ds, dra, other])
    a.add_pods([])
    r = a.result({"gitVersion": "v1.37.2"}, ["v1"])
    assert r["nodes"] == [
        {
            "name": "node2",
            "model": "NVIDIA-H100-80GB-HBM3",
            "capacity": {"nvidia.com/gpu": "8"},
            "allocatable": {"nvidia.com/gpu": "8"},
        }
    ]
    assert r["pluginGpusByModel"] == {"NVIDIA-H100-80GB-HBM3": 8}
    assert [(d["kind"], d["ready"], d["desired"]) for d in r["daemonSets"]] == [
        ("nvidia-device-plugin", 2, 2),
        ("nvidia-dra-driver", 2, 3),
    ]
    status = {i["id"]: (i["status"], i["evidence"]) for i in r["checklist"]}
    # node2 has both the device plugin's GPUs and gpu.nvidia.com slices in the seed inventory.
    assert (
        status["infrastructure/coexistence"][0] == "fail"
        and "node2" in status["infrastructure/coexistence"][1]
    )
    assert status["infrastructure/driver-ready"][0] == "fail"


def test_cronjob_owner_is_evaluated_once(policies: PolicySet) -> None:
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"namespace": "team-a", "name": "nightly"},
        "spec": {
            "schedule": "0 0 * * *",
            "jobTemplate": {"spec": {"template": pod_template("pytorch", {"limits": {"nvidia.com/gpu": 1}})}},
        },
    }
    jobs = [
        owned(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"namespace": "team-a", "name": f"n-{i}"},
                "spec": cron["spec"]["jobTemplate"]["spec"],
            },
            cron,
        )
        for i in range(3)
    ]
    a = assessor(policies, Objects(cron, *jobs), {"team-a": {}})
    a.add_claims([])
    pods = []
    for j in jobs:
        p = owned(
            {
                "metadata": {"namespace": "team-a", "name": j["metadata"]["name"] + "-p"},
                "spec": copy.deepcopy(j["spec"]["template"]["spec"]),
                "status": {"phase": "Running"},
            },
            j,
        )
        pods.append(p)
    a.add_pods(pods)
    r = a.result({"gitVersion": "v1.37.2"}, ["v1"])
    (w,) = r["legacyWorkloads"]
    assert w["owner"]["kind"] == "CronJob" and w["pods"] == 3
    assert w["migration"]["templates"][0]["deviceClass"] == "gpu.nvidia.com-a100"


def test_unreadable_pods_make_no_claim_look_leaked(policies: PolicySet) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": "c"},
        "spec": {"devices": {"requests": []}},
        "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]},
    }
    a = assessor(policies, Objects(), {"team-a": {}})
    a.add_claims([claim])
    a.unreadable["pods"] = "v1 pods: HTTP 403 (forbidden)"
    r = a.result({"gitVersion": "v1.37.2"}, ["v1"])
    assert r["claims"]["reservedForMissingPods"] == []
    item = next(i for i in r["checklist"] if i["id"] == "incidents/leaked-claims")
    assert item["status"] == "unknown" and "403" in item["evidence"]
    assert next(i for i in r["checklist"] if i["id"] == "workloads/legacy")["status"] == "unknown"


def test_dra_feature_signals(policies: PolicySet) -> None:
    a = assessor(policies, Objects(), {})
    part = copy.deepcopy(SLICES[0])
    part["spec"]["sharedCounters"] = [{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]
    part["spec"]["devices"][0]["taints"] = [{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}]
    a.add_slices([part])
    a.add_classes(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "x"},
                "spec": {"extendedResourceName": "example.com/gpu"},
            }
        ]
    )
    a.add_claims([])
    a.add_pods([])
    r = a.result(
        {"gitVersion": "v1.37.2"}, ["v1"], dra_resources={"v1": ["devicetaintrules", "resourceslices"]}
    )
    assert r["dra"]["signals"] == [
        "DeviceTaintRule API served (DRADeviceTaints)",
        "device taints (ResourceSlice devices[].taints)",
        "extended resources served by DRA (DeviceClass extendedResourceName)",
        "partitionable devices (ResourceSlice sharedCounters)",
    ]
