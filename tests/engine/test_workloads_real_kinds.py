"""Real public manifests of the workload CRDs (tests/engine/fixtures/real, each naming its source):
their pod templates and pods, their class, and what tier and migrate say about them."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.dra.workloads import pod_templates_of
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.engine.rules.tier import workload_facts
from webhook.policy.load import load_policies
from webhook.review.inputs import parse_yaml_documents

ROOT = Path(__file__).resolve().parents[2]
REAL = Path(__file__).parent / "fixtures" / "real"
POLICIES = load_policies(ROOT / "policies")


def _source(name: str) -> SourceObject:
    path = REAL / name
    (doc,) = parse_yaml_documents(path.read_text(), str(path))
    return SourceObject(doc.data, file=str(path), line=doc.line, doc_index=doc.index, lines=doc.lines)


@pytest.mark.parametrize(
    ("name", "templates"),
    [
        ("kserve-huggingface-llama3.yaml", [("/spec/predictor", 1), ("/spec/predictor/model", 1)]),
        ("kserve-llmisvc-pd-qwen2-7b.yaml", [("/spec/template", 1), ("/spec/prefill/template", 2)]),
        ("volcano-tf-example-gpu.yaml",
         [("/spec/tasks/0/template/spec", 1), ("/spec/tasks/1/template/spec", 3)]),
        ("trainer-torch-distributed-runtime.yaml",
         [("/spec/template/spec/replicatedJobs/0/template/spec/template/spec", 1)]),
    ],
)  # fmt: skip
def test_pod_templates_of_real_crds(name: str, templates: list[tuple[str, int]]) -> None:
    assert [(t.pointer, t.replicas) for t in pod_templates_of(_source(name).obj)] == templates


@pytest.mark.parametrize(
    ("name", "klass"),
    [
        # KServe's Hugging Face runtime serves a generative model with vLLM (no image, no --backend).
        ("kserve-huggingface-llama3.yaml", "llm"),
        # An LLMInferenceService without an image runs KServe's vLLM preset.
        ("kserve-llmisvc-pd-qwen2-7b.yaml", "llm"),
        ("volcano-tf-example-gpu.yaml", None),
    ],
)
def test_class_of_real_crds(name: str, klass: str | None) -> None:
    facts = workload_facts(_source(name).obj)
    assert facts is not None
    found = POLICIES.tier[0].classify(facts)
    assert (found.tier.name if found else None) == klass


def test_an_embedding_task_on_kserve_huggingface_is_not_an_llm() -> None:
    obj = dict(_source("kserve-huggingface-llama3.yaml").obj)
    model = obj["spec"]["predictor"]["model"]
    model["args"] = ["--model_name=bge", "--model_id=BAAI/bge-small-en-v1.5", "--task=text_embedding"]
    facts = workload_facts(obj)
    assert facts is not None and POLICIES.tier[0].classify(facts) is None


# A DeviceClass serving nvidia.com/gpu (KEP-5004) on A100s: the LLM class of the shipped tier policy
# may not use it.
A100_SERVED = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com-a100"},
    "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && "
        "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A100')")}}]},
}  # fmt: skip


@pytest.mark.parametrize("name", ["kserve-huggingface-llama3.yaml", "kserve-llmisvc-pd-qwen2-7b.yaml"])
def test_kserve_llms_on_a_served_class_are_judged_by_it(name: str) -> None:
    report = evaluate([SourceObject(A100_SERVED), _source(name)], POLICIES, Inventory.empty(), Context())
    tier = [f for f in report.findings if f.rule == "tier/gpu-tiers"]
    assert tier and all("served by DeviceClass gpu.nvidia.com-a100" in f.message for f in tier)
    assert all(f.line is not None for f in tier)  # each points at its template's limit
    assert not [f for f in report.findings if f.rule == "migrate/legacy-gpu"]


def test_kserve_model_form_gpus_are_rewritten_into_the_predictor_pod_spec() -> None:
    ctx = Context(namespace_labels={"team-ml": {"draguard.io/migration-mode": "migrate"}}, admission=True)
    report = evaluate([_source("kserve-huggingface-llama3.yaml")], POLICIES, Inventory.empty(), ctx,
                      rule_modules=("migrate",))
    (f,) = [f for f in report.findings if f.rule == "migrate/legacy-gpu"]
    assert f.patch and f.line is not None
    paths = {op["path"] for op in f.patch}
    # The claim in the predictor's PodSpec, the reference in the model container (KServe's types).
    assert "/spec/predictor/resourceClaims" in paths and "/spec/predictor/model/resources/claims" in paths
    assert "/spec/predictor/model/resources/limits/nvidia.com~1gpu" in paths


def test_volcano_job_is_migrated_per_task() -> None:
    ctx = Context(namespace_labels={"team-ml": {"draguard.io/migration-mode": "migrate"}}, admission=True)
    report = evaluate([_source("volcano-tf-example-gpu.yaml")], POLICIES, Inventory.empty(), ctx,
                      rule_modules=("migrate",))
    (f,) = [f for f in report.findings if f.rule == "migrate/legacy-gpu"]
    assert f.patch and all(op["path"].startswith("/spec/tasks/1/template/spec") for op in f.patch)
