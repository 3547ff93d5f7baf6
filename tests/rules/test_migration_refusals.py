"""What migration must refuse, with the reason, on real manifests from tests/corpus: HAMi vGPU pods
placed by HAMi's annotations, and Kubeflow's cluster-scoped ClusterTrainingRuntimes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from webhook.core.findings import Finding
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies
from webhook.review.inputs import parse_yaml_documents
from webhook.review.rewrite import migrate_paths

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus"
POLICIES = load_policies(ROOT / "policies")
RULE = "migrate/legacy-gpu"


def _obj(rel: str) -> dict[str, Any]:
    path = CORPUS / rel
    docs = [d.data for d in parse_yaml_documents(path.read_text(), str(path)) if isinstance(d.data, dict)]
    (obj,) = docs
    return copy.deepcopy(obj)


def _migrate_mode(obj: dict[str, Any]) -> list[Finding]:
    ns = obj["metadata"].get("namespace") or "default"
    ctx = Context(namespace_labels={ns: {"draguard.io/migration-mode": "migrate"}}, admission=True)
    report = evaluate([SourceObject(obj)], POLICIES, Inventory.empty(), ctx, rule_modules=("migrate",))
    return [f for f in report.findings if f.rule == RULE]


def _cli_notes(rel: str) -> tuple[str, list[str]]:
    """`draguard migrate <file>` (no --write): the rewritten text and the notes on what was left."""
    src = CORPUS / rel
    out = migrate_paths([str(src)], policies=str(ROOT / "policies"), policies_required=True,
                        strategy=None, write=False)
    return out.output, out.notes


@pytest.mark.parametrize(
    ("rel", "named"),
    [
        ("hami/specify_card_type_to_use.yaml", "nvidia.com/use-gputype=A100,V100"),
        ("hami/specify_card_type_not_use.yaml", "nvidia.com/nouse-gputype=1080,2080"),
        ("hami/specify_uuid_to_use.yaml", "nvidia.com/use-gpuuuid=GPU-03f69c50"),
        ("hami/specify_uuid_not_use.yaml", "nvidia.com/nouse-gpuuuid=GPU-03f69c50"),
        ("hami/specify_scheduling_policy.yaml", "hami.io/gpu-scheduler-policy=binpack"),
    ],
)
def test_a_pod_placed_by_hamis_annotations_is_not_rewritten(rel: str, named: str) -> None:
    (f,) = _migrate_mode(_obj(rel))
    # Admission in migrate mode warns with the reason and changes nothing.
    assert not f.patch and not f.generated
    assert "no automatic rewrite" in f.message and "HAMi" in f.message and named in f.message
    output, notes = _cli_notes(rel)
    assert "ResourceClaimTemplate" not in output
    (note,) = notes
    assert "left unchanged" in note and named in note


def test_without_hamis_annotations_the_same_pod_is_rewritten() -> None:
    obj = _obj("hami/specify_card_type_to_use.yaml")
    del obj["metadata"]["annotations"]
    (f,) = _migrate_mode(obj)
    assert f.patch and f.generated, f.message
    # An annotation of another project is no reason to refuse.
    obj["metadata"]["annotations"] = {"example.com/owner": "team-a"}
    (f,) = _migrate_mode(obj)
    assert f.patch, f.message


def test_hamis_annotations_on_a_deployments_pod_template_are_read() -> None:
    pod = _obj("hami/specify_scheduling_policy.yaml")
    template = {"metadata": {"annotations": pod["metadata"]["annotations"]}, "spec": pod["spec"]}
    deploy = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "default"},
        "spec": {"template": template},
    }  # fmt: skip
    (f,) = _migrate_mode(deploy)
    assert not f.patch and "hami.io/node-scheduler-policy=spread" in f.message


def test_thousands_of_hami_annotations_give_a_short_reason() -> None:
    obj = _obj("hami/specify_scheduling_policy.yaml")
    obj["metadata"]["annotations"] = {f"hami.io/k{i:05d}": "v" * 1000 for i in range(5000)}
    (f,) = _migrate_mode(obj)
    assert not f.patch
    assert "4997 more" in f.message
    assert len(f.message) < 2000


@pytest.mark.parametrize(
    "rel",
    [
        "kubeflow-trainer/llama3_2-llama3_2_1B.yaml",
        "kubeflow-trainer/llama3_2-llama3_2_3B.yaml",
        "kubeflow-trainer/qwen2_5-qwen2_5_1.5B.yaml",
    ],
)
def test_a_cluster_training_runtime_is_not_rewritten(rel: str) -> None:
    (f,) = _migrate_mode(_obj(rel))
    assert not f.patch and not f.generated
    assert "cluster-scoped" in f.message and "namespaced TrainingRuntime" in f.message
    _output, notes = _cli_notes(rel)
    (note,) = notes
    assert "ClusterTrainingRuntime/" in note and "cluster-scoped" in note


def test_the_same_runtime_namespaced_is_rewritten() -> None:
    obj = _obj("kubeflow-trainer/llama3_2-llama3_2_1B.yaml")
    obj["kind"] = "TrainingRuntime"
    obj["metadata"]["namespace"] = "team-ml"
    (f,) = _migrate_mode(obj)
    assert f.patch and f.generated, f.message
    (tmpl,) = f.generated
    assert tmpl["metadata"]["namespace"] == "team-ml"
