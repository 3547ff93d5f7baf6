"""Workload CRDs (Kubeflow PyTorchJob and TrainJob, JobSet, LeaderWorkerSet, KubeRay, KServe): their
pod templates come from one table (webhook/dra/workloads.py) that quota, tier and migration read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.dra.workloads import pod_templates_of
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies

POLICIES = load_policies(Path(__file__).resolve().parents[2] / "policies")


PYTORCH = "nvcr.io/nvidia/pytorch:24.01-py3"


def _pod(gpus: int = 0, image: str = PYTORCH, claim: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": image}
    spec: dict[str, Any] = {"containers": [c]}
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    if claim:
        c["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim}]
    return {"spec": spec}


def _obj(api: str, kind: str, spec: dict[str, Any], ns: str = "team-ml") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "w", "namespace": ns}, "spec": spec}


CRDS: dict[str, tuple[dict[str, Any], list[tuple[str, int]]]] = {
    "PyTorchJob": (
        _obj("kubeflow.org/v1", "PyTorchJob", {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": _pod(8)}, "Worker": {"replicas": 3, "template": _pod(8)}}}),
        [("/spec/pytorchReplicaSpecs/Master/template/spec", 1),
         ("/spec/pytorchReplicaSpecs/Worker/template/spec", 3)],
    ),
    "JobSet": (
        _obj("jobset.x-k8s.io/v1alpha2", "JobSet", {"replicatedJobs": [
            {"name": "w", "replicas": 2, "template": {"spec": {"parallelism": 4, "template": _pod(1)}}}]}),
        [("/spec/replicatedJobs/0/template/spec/template/spec", 8)],
    ),
    "LeaderWorkerSet": (
        _obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", {"replicas": 2, "leaderWorkerTemplate": {
            "size": 4, "leaderTemplate": _pod(1), "workerTemplate": _pod(1)}}),
        [("/spec/leaderWorkerTemplate/leaderTemplate/spec", 2),
         ("/spec/leaderWorkerTemplate/workerTemplate/spec", 6)],
    ),
    "RayCluster": (
        _obj("ray.io/v1", "RayCluster", {"headGroupSpec": {"template": _pod()},
                                         "workerGroupSpecs": [{"replicas": 3, "template": _pod(2)}]}),
        [("/spec/headGroupSpec/template/spec", 1), ("/spec/workerGroupSpecs/0/template/spec", 3)],
    ),
    "RayJob": (
        _obj("ray.io/v1", "RayJob", {"rayClusterSpec": {
            "headGroupSpec": {"template": _pod()},
            "workerGroupSpecs": [{"replicas": 2, "template": _pod(1)}]}}),
        [("/spec/rayClusterSpec/headGroupSpec/template/spec", 1),
         ("/spec/rayClusterSpec/workerGroupSpecs/0/template/spec", 2)],
    ),
    "RayService": (
        _obj("ray.io/v1", "RayService", {"rayClusterConfig": {"headGroupSpec": {"template": _pod()},
                                                              "workerGroupSpecs": [{"template": _pod(1)}]}}),
        [("/spec/rayClusterConfig/headGroupSpec/template/spec", 1),
         ("/spec/rayClusterConfig/workerGroupSpecs/0/template/spec", 1)],
    ),
    "TrainJob": (
        _obj("trainer.kubeflow.org/v1alpha1", "TrainJob", {"trainer": {
            "numNodes": 4, "image": "x", "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}}}}),
        [("/spec/trainer", 4)],
    ),
    "InferenceService": (
        _obj("serving.kserve.io/v1beta1", "InferenceService",
             {"predictor": {"minReplicas": 2, **_pod(1)["spec"]}}),
        [("/spec/predictor", 2)],
    ),
    # KServe's framework forms are one container each (PredictorExtensionSpec inlines a Container);
    # `workerSpec` is the multi-node workers' PodSpec.
    "InferenceService/model": (
        _obj("serving.kserve.io/v1beta1", "InferenceService", {"predictor": {
            "minReplicas": 2,
            "model": {"modelFormat": {"name": "huggingface"}, "resources": {"limits": {"nvidia.com/gpu": 2}}},
            "workerSpec": {"pipelineParallelSize": 2, **_pod(2)["spec"]}}}),
        [("/spec/predictor", 2), ("/spec/predictor/model", 2), ("/spec/predictor/workerSpec", 2)],
    ),
    "LLMInferenceService": (
        _obj("serving.kserve.io/v1alpha1", "LLMInferenceService", {
            "replicas": 2, "template": _pod(1)["spec"], "worker": _pod(4)["spec"],
            "prefill": {"replicas": 3, "template": _pod(2)["spec"]}}),
        [("/spec/template", 2), ("/spec/worker", 2), ("/spec/prefill/template", 3)],
    ),
    "VolcanoJob": (
        _obj("batch.volcano.sh/v1alpha1", "Job", {"minAvailable": 3, "tasks": [
            {"name": "ps", "replicas": 1, "template": _pod()},
            {"name": "worker", "replicas": 2, "template": _pod(4)}]}),
        [("/spec/tasks/0/template/spec", 1), ("/spec/tasks/1/template/spec", 2)],
    ),
    "ClusterTrainingRuntime": (
        {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
         "metadata": {"name": "torch-distributed"},
         "spec": {"template": {"spec": {"replicatedJobs": [
             {"name": "node", "template": {"spec": {"template": _pod(1)}}}]}}}},
        [("/spec/template/spec/replicatedJobs/0/template/spec/template/spec", 1)],
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_pod_templates_and_replicas(kind: str) -> None:
    obj, expected = CRDS[kind]
    assert [(t.pointer, t.replicas) for t in pod_templates_of(obj)] == expected


@pytest.mark.parametrize("kind", sorted(k for k in CRDS if k != "ClusterTrainingRuntime"))
def test_quota_charges_every_template(kind: str) -> None:
    obj, expected = CRDS[kind]
    report = evaluate([SourceObject(obj)], POLICIES, Inventory.empty(), Context(), rule_modules=("quota",))
    gpus = {t.pointer: sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                           for c in t.spec.get("containers", [])) for t in pod_templates_of(obj)}  # fmt: skip
    total = sum(gpus[p] * n for p, n in expected)
    over = [f for f in report.findings if f.rule == "quota/team-budgets" and "GPU-equivalents" in f.message]
    # The shipped team-* budget is 16 GPU-equivalents.
    assert bool(over) == (total > 16), (total, [f.message for f in report.findings])
    if over:
        assert f"asks for {total} GPU-equivalents" in over[0].message


def test_tier_rule_sees_a_kserve_predictor() -> None:
    tmpl = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "a100", "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com-a100"}}]}}}}  # fmt: skip
    predictor = _pod(image="vllm/vllm-openai:v0.6.0", claim="a100")["spec"]
    isvc = _obj("serving.kserve.io/v1beta1", "InferenceService", {"predictor": predictor}, ns="ml")
    report = evaluate([SourceObject(tmpl), SourceObject(isvc)], POLICIES, Inventory.empty(), Context())
    tier = [f for f in report.findings if f.rule == "tier/gpu-tiers"]
    assert tier and tier[0].object.kind == "InferenceService" and "gpu.nvidia.com-a100" in tier[0].message


def test_migration_rewrites_every_template_of_a_pytorchjob() -> None:
    obj = CRDS["PyTorchJob"][0]
    ctx = Context(namespace_labels={"team-ml": {"draguard.io/migration-mode": "migrate"}}, admission=True)
    report = evaluate([SourceObject(obj)], POLICIES, Inventory.empty(), ctx, rule_modules=("migrate",))
    patches = [op for f in report.findings if f.patch for op in f.patch]
    out = jsonpatch.apply_patch(obj, patches)
    for role in ("Master", "Worker"):
        spec = out["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]
        assert spec["resourceClaims"] and "limits" not in spec["containers"][0]["resources"]


def test_a_batch_v1_job_is_not_read_as_a_volcano_job() -> None:
    job = _obj("batch/v1", "Job", {"parallelism": 2, "template": _pod(1)})
    assert [(t.pointer, t.replicas) for t in pod_templates_of(job)] == [("/spec/template/spec", 2)]


def test_the_workload_class_comes_from_every_template() -> None:
    # KubeRay's vLLM sample: the head runs plain Ray, the GPU worker group runs the server.
    tmpl = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "a100", "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com-a100"}}]}}}}  # fmt: skip
    head = _pod(image="rayproject/ray:2.46.0-py311")
    worker = _pod(image="vllm/vllm-openai:v0.9.0", claim="a100")
    groups = {"headGroupSpec": {"template": head}, "workerGroupSpecs": [{"replicas": 1, "template": worker}]}
    ray = _obj("ray.io/v1", "RayCluster", groups, ns="ml")
    report = evaluate([SourceObject(tmpl), SourceObject(ray)], POLICIES, Inventory.empty(), Context())
    (f,) = [f for f in report.findings if f.rule == "tier/gpu-tiers"]
    assert "'llm'" in f.message and "vllm/vllm-openai" in f.message


def test_a_kserve_model_form_is_judged_by_its_class() -> None:
    dc = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
          "metadata": {"name": "gpu.nvidia.com-a100"},
          "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [
              {"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
    isvc = _obj("serving.kserve.io/v1beta1", "InferenceService", {"predictor": {"model": {
        "modelFormat": {"name": "huggingface"}, "image": "vllm/vllm-openai:v0.9.0",
        "resources": {"limits": {"nvidia.com/gpu": 1}}}}}, ns="ml")
    report = evaluate([SourceObject(dc), SourceObject(isvc)], POLICIES, Inventory.empty(), Context())
    (f,) = [f for f in report.findings if f.rule == "tier/gpu-tiers"]
    assert "served by DeviceClass gpu.nvidia.com-a100" in f.message


def test_admission_looks_up_the_templates_every_pod_template_names() -> None:
    from webhook.engine.rules.tier import lookups_needed

    head = _pod(image="rayproject/ray:2.46.0-py311")
    worker = _pod(image="vllm/vllm-openai:v0.9.0", claim="h100-pair")
    groups = {"headGroupSpec": {"template": head}, "workerGroupSpecs": [{"replicas": 2, "template": worker}]}
    ray = _obj("ray.io/v1", "RayCluster", groups, ns="ml")
    got = lookups_needed(ray, POLICIES.tier, Inventory.empty(), "ml", {})
    assert got == [("ResourceClaimTemplate", "ml", "h100-pair")]


@pytest.mark.parametrize(
    ("spec", "llm"),
    [
        # RayJob: the entrypoint is a command line; runtimeEnvYAML's pip block list names packages.
        ({"entrypoint": "python -m verl.trainer.main_ppo data.train_files=x"}, True),
        ({"entrypoint": "python train.py", "runtimeEnvYAML": "pip:\n  - sglang[all]>=0.4\n"}, True),
        ({"entrypoint": "python t.py", "runtimeEnvYAML": "pip:\n  - torch\nenv_vars:\n  - vllm\n"}, False),
        ({"entrypoint": "python train.py", "runtimeEnvYAML": "pip: [torch, 'vllm==0.8.5']\n"}, True),
        # A tenant's many blank lines are read once, line by line.
        ({"entrypoint": "python train.py", "runtimeEnvYAML": "\n" * 200_000 + "pip:\n  - torch\n"}, False),
    ],
)
def test_what_a_rayjob_runs_beyond_its_containers(spec: dict[str, Any], llm: bool) -> None:
    from webhook.engine.rules.tier import workload_facts

    body = {**spec, "rayClusterSpec": {"headGroupSpec": {"template": _pod(image="rayproject/ray:2.46.0")}}}
    facts = workload_facts(_obj("ray.io/v1", "RayJob", body))
    assert facts is not None
    found = POLICIES.tier[0].classify(facts)
    assert (found is not None and found.tier.name == "llm") == llm, found
