"""Real public manifests (tests/engine/fixtures/real, each naming its source) through classification
and `migrate/legacy-gpu`: a rewrite that would change what the workload gets is refused, per object,
with the reason and what to do instead."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from webhook.core.findings import Finding, Mode
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.engine.migration import plan_pod_spec
from webhook.engine.rules.tier import workload_facts
from webhook.policy.load import load_policies
from webhook.review.inputs import parse_yaml_documents

ROOT = Path(__file__).resolve().parents[2]
REAL = Path(__file__).parent / "fixtures" / "real"
POLICIES = load_policies(ROOT / "policies")
MIGRATE = {"team-ml": {"draguard.io/migration-mode": "migrate"}}
RULE = "migrate/legacy-gpu"


def _sources(name: str) -> list[SourceObject]:
    path = REAL / name
    docs = parse_yaml_documents(path.read_text(), str(path))
    return [SourceObject(d.data, file=str(path), line=d.line, doc_index=d.index, lines=d.lines) for d in docs]


def _migrate(objs: list[SourceObject], labels: dict[str, dict[str, str]] | None = None) -> list[Finding]:
    ctx = Context(namespace_labels=labels or MIGRATE, admission=True)
    report = evaluate(objs, POLICIES, Inventory.empty(), ctx, rule_modules=("migrate",))
    return [f for f in report.findings if f.rule == RULE]


def _class_of(obj: dict[str, Any]) -> tuple[str, str] | None:
    facts = workload_facts(obj)
    assert facts is not None
    found = POLICIES.tier[0].classify(facts)
    return (found.tier.name, found.reason) if found else None


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        # Ray Serve with vLLM from its runtime_env pip list; the pods run plain Ray images.
        ("kuberay-ray-service-vllm.yaml", '"python -m vllm"'),
        # verl's image names vLLM only inside its tag (vllm0.8.4).
        ("kuberay-ray-cluster-verl.yaml", "hiyouga/verl"),
        # TensorRT-LLM on LeaderWorkerSet: a custom image, the Triton TensorRT-LLM backend's repository.
        ("lws-tensorrt-llm.yaml", "tensorrtllm_backend"),
        ("tgi-gke-l4.yaml", "text-generation-inference"),
        ("lws-vllm-kueue.yaml", "vllm"),
    ],
)
def test_llm_servers_of_real_manifests_are_detected(name: str, reason: str) -> None:
    (src,) = _sources(name)
    found = _class_of(dict(src.obj))
    assert found is not None and found[0] == "llm" and reason in found[1], found


@pytest.mark.parametrize(
    ("image", "args"),
    [
        ("ghcr.io/huggingface/text-embeddings-inference:1.5", ["--model-id", "BAAI/bge-large-en-v1.5"]),
        ("nvcr.io/nvidia/tritonserver:24.01-py3", ["tritonserver", "--model-repository=/models/resnet50"]),
    ],
)
def test_embedding_and_vision_servers_are_not_llms(image: str, args: list[str]) -> None:
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"template": {"spec": {"containers": [{"name": "s", "image": image, "args": args}]}}}}
    found = _class_of(obj)
    assert found is None or found[0] != "llm", found


def test_kuberay_keeps_its_gpu_limit() -> None:
    for name in ("kuberay-ray-service-vllm.yaml", "kuberay-ray-cluster-verl.yaml"):
        findings = _migrate(_sources(name))
        assert findings, name
        for f in findings:
            assert f.patch is None and not f.generated
            assert "--num-gpus" in f.message and "rayStartParams" in f.message, f.message


def test_hami_vgpu_shares_are_not_turned_into_whole_gpus() -> None:
    (f,) = _migrate(_sources("hami-default-use.yaml"))
    assert f.patch is None
    assert "HAMi vGPU share (nvidia.com/gpucores, nvidia.com/gpumem)" in f.message


def test_time_sliced_replicas_are_not_turned_into_whole_gpus() -> None:
    (f,) = _migrate(_sources("gpu-operator-time-slicing.yaml"))
    assert f.patch is None
    assert "nvidia.com/gpu.product=Tesla-T4-SHARED" in f.message and "time-sliced" in f.message


def test_a_pod_pinned_to_l4_gets_no_claim_for_another_gpu() -> None:
    (f,) = _migrate(_sources("tgi-gke-l4.yaml"))
    assert f.patch is None and f.mode is Mode.WARN
    assert "cloud.google.com/gke-accelerator=nvidia-l4" in f.message
    assert "nodeSelector: {cloud.google.com/gke-accelerator: nvidia-l4}" in f.message
    assert "deviceClass: <a class of that GPU>} to MigrationPolicy legacy-gpu" in f.message


L4_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com-l4"},
    "spec": {"selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu' && "
        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L4'")}}]},
}  # fmt: skip


def test_a_pod_pinned_to_l4_gets_the_l4_class_when_one_exists() -> None:
    # The gpu-operator test Deployment, pinned to whole L4s instead of time-sliced T4s.
    (src,) = _sources("gpu-operator-time-slicing.yaml")
    obj: dict[str, Any] = dict(src.obj)
    obj["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    (f,) = _migrate([SourceObject(L4_CLASS), SourceObject(obj)])
    assert f.patch and "DeviceClass gpu.nvidia.com-l4" in f.message, f.message
    (tmpl,) = f.generated
    assert tmpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com-l4"


def test_kueue_managed_workloads_say_which_mapping_kueue_needs() -> None:
    findings = _migrate(_sources("lws-vllm-kueue.yaml"))
    assert len(findings) == 2  # leader and worker templates
    for f in findings:
        assert f.patch is None
        assert "queue default" in f.message
        assert "{name: nvidia.com/gpu, deviceClassNames: [gpu.nvidia.com-h100]}" in f.message


def test_refusals_reach_draguard_migrate_as_notes() -> None:
    from webhook.dra.workloads import pod_templates_of

    (src,) = _sources("hami-default-use.yaml")
    (t,) = pod_templates_of(src.obj)
    plan = plan_pod_spec(src.obj, t.pointer, t.spec, POLICIES.migration[0], namespace="team-ml")
    assert not plan.patch and not plan.edits
    assert [u.resource for u, _why in plan.refused] == ["nvidia.com/gpu"]


# NVIDIA's DRA driver chart ships its gpu.nvidia.com class with extendedResourceName (KEP-5004).
SERVED_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'")}}]},
}  # fmt: skip


def test_a_resource_served_by_a_device_class_is_dra_already() -> None:
    objs = [SourceObject(SERVED_CLASS), *_sources("tgi-gke-l4.yaml")]
    enforce = {"team-ml": {"draguard.io/migration-mode": "enforce"}}
    assert _migrate(objs, enforce) == []
    # ... and the tier rule judges it through that class: an LLM on an unrestricted GPU class.
    report = evaluate(objs, POLICIES, Inventory.empty(), Context(namespace_labels=enforce))
    tier = [f for f in report.findings if f.rule.startswith("tier/")]
    assert tier and "served by DeviceClass gpu.nvidia.com" in tier[0].message
    assert not [f for f in report.findings if f.rule == RULE]


def test_draguard_migrate_leaves_refused_and_served_workloads_alone(tmp_path: Path) -> None:
    from webhook.review.rewrite import migrate_paths

    for name in ("hami-default-use.yaml", "tgi-gke-l4.yaml", "kuberay-ray-cluster-verl.yaml"):
        (tmp_path / name).write_text((REAL / name).read_text())
    out = migrate_paths([str(tmp_path)], policies=str(ROOT / "policies"), policies_required=True,
                        strategy=None, write=False)
    assert out.output == "" and out.changed == []
    notes = "\n".join(out.notes)
    assert "HAMi vGPU share" in notes and "--num-gpus" in notes and "gke-accelerator=nvidia-l4" in notes
    # With NVIDIA's class serving nvidia.com/gpu among the files, the L4 pod is DRA already.
    (tmp_path / "class.yaml").write_text(yaml.safe_dump(SERVED_CLASS))
    out = migrate_paths([str(tmp_path)], policies=str(ROOT / "policies"), policies_required=True,
                        strategy=None, write=False)
    assert out.changed == [] and "gke-accelerator" not in "\n".join(out.notes)


def test_draguard_migrate_picks_the_class_of_the_pinned_gpu(tmp_path: Path) -> None:
    from webhook.review.rewrite import migrate_paths

    (src,) = _sources("gpu-operator-time-slicing.yaml")
    obj: dict[str, Any] = dict(src.obj)
    obj["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    (tmp_path / "app.yaml").write_text(yaml.safe_dump(obj))
    (tmp_path / "classes.yaml").write_text(yaml.safe_dump(L4_CLASS))
    out = migrate_paths([str(tmp_path)], policies=str(ROOT / "policies"), policies_required=True,
                        strategy=None, write=False)
    assert "deviceClassName: gpu.nvidia.com-l4" in out.output, (out.output, out.notes)


def _slice(node: str, nvlink: list[str | None]) -> dict[str, Any]:
    devices = []
    for i, domain in enumerate(nvlink):
        attrs: dict[str, Any] = {"type": {"string": "gpu"},
                                 "productName": {"string": "NVIDIA H100 80GB HBM3"}}
        if domain is not None:
            attrs["nvlinkDomain"] = {"string": domain}
        devices.append({"name": f"gpu-{i}", "attributes": attrs})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "generation": 1,
                     "resourceSliceCount": 1}, "devices": devices}}  # fmt: skip


H100_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com-h100"},
    "spec": {"selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu' && "
        "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')")}}]},
}  # fmt: skip


def _vllm_tp2() -> dict[str, Any]:
    # The Kueue example's leader template as a Deployment with 2 GPUs, without Kueue.
    (src,) = _sources("lws-vllm-kueue.yaml")
    leader = src.obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    spec = copy.deepcopy(dict(leader["spec"]))
    spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    meta = {"name": "vllm", "namespace": "team-ml"}
    template = {"template": {"spec": spec}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": template}


@pytest.mark.parametrize(
    ("nodes", "joined"),
    [
        # Every node with two H100s has them in one NVLink domain: the template requires it.
        ({"node-a": ["d0", "d0"], "node-b": ["d1", "d1", "d2", "d2"]}, True),
        # PCIe H100s publish no nvlinkDomain: a constraint could never be met there.
        ({"node-a": ["d0", "d0"], "node-b": [None, None]}, False),
    ],
)
def test_multi_gpu_templates_join_gpus_by_nvlink_where_the_inventory_allows(
    nodes: dict[str, list[str | None]], joined: bool
) -> None:
    inventory = Inventory.from_objects([*(_slice(n, d) for n, d in nodes.items()), H100_CLASS])
    ctx = Context(namespace_labels=MIGRATE, admission=True)
    report = evaluate([SourceObject(_vllm_tp2())], POLICIES, inventory, ctx, rule_modules=("migrate",))
    (f,) = [f for f in report.findings if f.rule == RULE]
    (tmpl,) = f.generated
    devices = tmpl["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com-h100"
    want = [{"requests": ["gpu"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}] if joined else None
    assert devices.get("constraints") == want
    # The migrated workload and its template pass draguard's own review without the interconnect
    # warning whenever the inventory lets the constraint be written.
    rewritten = jsonpatch.apply_patch(_vllm_tp2(), f.patch)
    review = evaluate([SourceObject(rewritten), SourceObject(tmpl)], POLICIES, inventory, Context())
    interconnect = [x for x in review.findings if x.rule == "structure/interconnect"]
    assert bool(interconnect) == (not joined), [x.message for x in review.findings]


def test_the_finding_offers_the_extended_resource_path_beside_the_rewrite() -> None:
    src = SourceObject(_vllm_tp2())
    warn = {"team-ml": {"draguard.io/migration-mode": "warn"}}
    (f,) = _migrate([src], warn)
    assert "spec.extendedResourceName: nvidia.com/gpu on DeviceClass gpu.nvidia.com-h100" in f.fix


@pytest.mark.parametrize(
    ("label", "value", "device_class", "contradicts"),
    [
        # GKE's accelerator names leave out the form factor NVML reports (A100-SXM4-80GB).
        ("cloud.google.com/gke-accelerator", "nvidia-a100-80gb", "gpu.nvidia.com-a100-80gb", False),
        ("cloud.google.com/gke-accelerator", "nvidia-a100-80gb", "gpu.nvidia.com-a100-40gb", True),
        ("cloud.google.com/gke-accelerator", "nvidia-tesla-a100", "gpu.nvidia.com-a100", False),
        ("cloud.google.com/gke-accelerator", "nvidia-l4", "gpu.nvidia.com-h100", True),
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3", "gpu.nvidia.com-h100", False),
        ("nvidia.com/gpu.product", "Tesla-T4", "gpu.nvidia.com-a100", True),
        ("karpenter.k8s.aws/instance-gpu-name", "a10g", "gpu.nvidia.com-a10g", False),
        # A class whose name names no model contradicts nothing.
        ("nvidia.com/gpu.product", "Tesla-T4", "gpu.nvidia.com", False),
    ],
)
def test_a_pinned_gpu_model_and_a_class_name(
    label: str, value: str, device_class: str, contradicts: bool
) -> None:
    from webhook.engine.migration import contradiction
    from webhook.policy.model import ResourceMapping

    found = contradiction({label: value}, ResourceMapping("nvidia.com/gpu", device_class), None)
    assert (found is not None) == contradicts, found
