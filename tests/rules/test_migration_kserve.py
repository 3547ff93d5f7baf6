"""KServe's one-container InferenceService forms (`predictor.tensorflow`, `predictor.pytorch`,
`predictor.model`) through `draguard migrate` and admission's migrate mode, on the corpus's real
manifests: the claim lands in the predictor's PodSpec (`spec.predictor.resourceClaims`, KServe's
v1beta1 PredictorSpec inlines a PodSpec), the form's container names it in `resources.claims`, and
a form pinned to another GPU (the gke-accelerator annotation, a machine type) is refused."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.findings import Finding
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.engine.migration import instance_gpu
from webhook.policy.load import load_policies
from webhook.review.rewrite import migrate_paths

ROOT = Path(__file__).resolve().parents[2]
KSERVE = ROOT / "tests" / "corpus" / "kserve"
POLICIES = load_policies(ROOT / "policies")
RULE = "migrate/legacy-gpu"
# corev1.PodResourceClaim and corev1.ResourceClaim (a container's reference): their JSON fields.
POD_CLAIM_FIELDS = {"name", "resourceClaimName", "resourceClaimTemplateName"}
CONTAINER_RESOURCES_FIELDS = {"limits", "requests", "claims"}


def _migrate(tmp: Path, *names: str) -> tuple[list[dict[str, Any]], list[str]]:
    """`draguard migrate --write` on copies of corpus files: the documents written, and the notes."""
    copies = []
    for name in names:
        copies.append(tmp / name)
        shutil.copyfile(KSERVE / name, copies[-1])
    out = migrate_paths([str(p) for p in copies], policies=str(ROOT / "policies"), policies_required=True,
                        strategy=None, write=True)
    docs = [d for p in copies for d in yaml.safe_load_all(p.read_text()) if d is not None]
    return docs, out.notes


def _review(path: Path) -> list[Finding]:
    from webhook.review.inputs import parse_yaml_documents

    docs = parse_yaml_documents(path.read_text(), str(path))
    objs = [SourceObject(d.data, file=str(path), line=d.line, doc_index=d.index, lines=d.lines)
            for d in docs if isinstance(d.data, dict)]  # fmt: skip
    return evaluate(objs, POLICIES, Inventory.empty(), Context()).findings


@pytest.mark.parametrize(
    ("name", "form"),
    [
        ("tensorflow-gpu.yaml", "tensorflow"),
        ("torchserve-v1-gpu.yaml", "pytorch"),
        ("v2-bert-bert_gpu.yaml", "pytorch"),
        ("storage-hf-hf_isvc.yaml", "model"),
    ],
)
def test_a_one_container_form_gets_its_claim_in_the_predictor_pod_spec(
    name: str, form: str, tmp_path: Path
) -> None:
    before = yaml.safe_load((KSERVE / name).read_text())
    docs, notes = _migrate(tmp_path, name)
    assert not notes
    isvc, template = docs
    predictor = isvc["spec"]["predictor"]
    # The one field added to the predictor is its inlined PodSpec's `resourceClaims` (KServe's
    # v1beta1 PodSpec has `resourceClaims []corev1.PodResourceClaim`).
    assert set(predictor) - set(before["spec"]["predictor"]) == {"resourceClaims"}
    (pod_claim,) = predictor["resourceClaims"]
    assert set(pod_claim) <= POD_CLAIM_FIELDS
    resources = predictor[form]["resources"]
    assert set(resources) <= CONTAINER_RESOURCES_FIELDS
    assert resources["claims"] == [{"name": pod_claim["name"]}]
    assert "nvidia.com/gpu" not in str(resources)
    # Everything else the user wrote is kept: the form's other fields, the other resources.
    kept = {k: v for k, v in before["spec"]["predictor"][form].items() if k != "resources"}
    assert {k: v for k, v in predictor[form].items() if k != "resources"} == kept
    old_limits = {k: v for k, v in before["spec"]["predictor"][form]["resources"].get("limits", {}).items()
                  if k != "nvidia.com/gpu"}  # fmt: skip
    assert resources.get("limits", {}) == old_limits
    # The template it names asks for the one GPU the device plugin gave.
    assert template["kind"] == "ResourceClaimTemplate"
    assert template["metadata"]["name"] == pod_claim["resourceClaimTemplateName"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 1


def test_the_rewritten_file_round_trips_and_reviews_clean(tmp_path: Path) -> None:
    docs, _notes = _migrate(tmp_path, "torchserve-v2-mnist_gpu.yaml")
    written = tmp_path / "torchserve-v2-mnist_gpu.yaml"
    text = written.read_text()
    # Read back, the same objects; migrating again changes nothing.
    assert [d for d in yaml.safe_load_all(text) if d is not None] == docs
    again = migrate_paths([str(written)], policies=str(ROOT / "policies"), policies_required=True,
                          strategy=None, write=False)
    assert again.output == "" and not again.changed and not again.notes
    # No legacy-GPU finding, and no claim the pod declares but no container uses.
    rules = {f.rule for f in _review(written)}
    assert not {r for r in rules if r.startswith(("migrate/", "structure/"))}, rules


def test_before_the_rewrite_review_points_at_the_forms_gpu() -> None:
    findings = [f for f in _review(KSERVE / "tensorflow-gpu.yaml") if f.rule == RULE]
    (f,) = findings
    lines = (KSERVE / "tensorflow-gpu.yaml").read_text().splitlines()
    assert "nvidia.com/gpu: 1" in lines[f.line - 1]  # the form's own limit
    assert "no automatic rewrite" not in f.message and "draguard migrate" in f.fix
    # Named as the user wrote it: the form's field, and where the claim goes.
    assert f.message.startswith("spec.predictor.tensorflow asks for nvidia.com/gpu: 1")
    assert "with spec.predictor.resourceClaims {name: kserve-container-gpu" in f.message


def test_admission_in_migrate_mode_patches_the_predictor() -> None:
    obj = yaml.safe_load((KSERVE / "torchserve-v1-gpu.yaml").read_text())
    ctx = Context(namespace_labels={"default": {"draguard.io/migration-mode": "migrate"}}, admission=True)
    report = evaluate([SourceObject(obj)], POLICIES, Inventory.empty(), ctx, rule_modules=("migrate",))
    (f,) = [f for f in report.findings if f.rule == RULE]
    assert f.patch and f.generated
    by_path = {op["path"]: op for op in f.patch}
    assert by_path["/spec/predictor/resourceClaims"]["op"] == "add"
    assert by_path["/spec/predictor/pytorch/resources/claims"]["op"] == "add"
    assert by_path["/spec/predictor/pytorch/resources/limits/nvidia.com~1gpu"]["op"] == "remove"


def test_a_predictor_with_its_own_gpu_container_and_a_model_gets_one_claim_list(tmp_path: Path) -> None:
    obj = yaml.safe_load((KSERVE / "tensorflow-gpu.yaml").read_text())
    obj["spec"]["predictor"]["containers"] = [
        {"name": "encoder", "image": "example.com/encoder:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    ]
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(obj))
    migrate_paths([str(path)], policies=str(ROOT / "policies"), policies_required=True, strategy=None,
                  write=True)
    isvc = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "InferenceService")
    predictor = isvc["spec"]["predictor"]
    names = [c["name"] for c in predictor["resourceClaims"]]
    assert len(names) == 2 and len(set(names)) == 2  # neither claim replaced the other
    used = {c["name"] for c in predictor["containers"][0]["resources"]["claims"]}
    used |= {c["name"] for c in predictor["tensorflow"]["resources"]["claims"]}
    assert used == set(names)
    assert not {f.rule for f in _review(path) if f.rule.startswith(("migrate/", "structure/"))}


@pytest.mark.parametrize(
    ("name", "pinned"),
    [
        # KServe's pod mutator turns this annotation into a cloud.google.com/gke-accelerator selector.
        ("accelerators-tensorflow-gpu.yaml", "cloud.google.com/gke-accelerator=nvidia-tesla-t4"),
        # An AWS g5 machine has A10G GPUs; the LLM would get an H100 class.
        ("fluid-kserve-isvc.yaml", "node.kubernetes.io/instance-type=g5.8xlarge (A10G GPUs)"),
    ],
)
def test_a_form_pinned_to_another_gpu_is_refused(name: str, pinned: str, tmp_path: Path) -> None:
    original = (KSERVE / name).read_text()
    _docs, notes = _migrate(tmp_path, name)
    assert (tmp_path / name).read_text() == original
    (note,) = notes
    assert "left unchanged" in note and pinned in note and "could never be allocated" in note
    assert "spec.predictor." in note  # the form, by the field the user wrote
    obj = yaml.safe_load(original)
    ctx = Context(namespace_labels={"default": {"draguard.io/migration-mode": "migrate"}}, admission=True)
    report = evaluate([SourceObject(obj)], POLICIES, Inventory.empty(), ctx, rule_modules=("migrate",))
    (f,) = [f for f in report.findings if f.rule == RULE]
    assert not f.patch and "no automatic rewrite" in f.message and pinned in f.message


def test_a_machine_type_of_the_mapped_gpu_is_no_reason_to_refuse(tmp_path: Path) -> None:
    obj = copy.deepcopy(yaml.safe_load((KSERVE / "fluid-kserve-isvc.yaml").read_text()))
    # p5 machines carry H100s: the LLM's H100 class fits them.
    obj["spec"]["predictor"]["nodeSelector"] = {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    path = tmp_path / "p5.yaml"
    path.write_text(yaml.safe_dump(obj))
    out = migrate_paths([str(path)], policies=str(ROOT / "policies"), policies_required=True, strategy=None,
                        write=True)
    assert out.changed and not out.notes
    template = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "ResourceClaimTemplate")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com-h100"


@pytest.mark.parametrize(
    ("machine", "gpu"),
    [("g5.8xlarge", "A10G"), ("g4dn.xlarge", "T4"), ("p4de.24xlarge", "A100 80GB"),
     ("a3-highgpu-8g", "H100 80GB"), ("g2-standard-8", "L4"), ("m5.large", None), ("g5g.xlarge", None),
     ("", None)],
)  # fmt: skip
def test_machine_types_name_their_gpu_model(machine: str, gpu: str | None) -> None:
    assert instance_gpu(machine) == gpu


def test_the_extended_resource_strategy_serves_a_forms_gpu(tmp_path: Path) -> None:
    path = tmp_path / "tensorflow-gpu.yaml"
    shutil.copyfile(KSERVE / "tensorflow-gpu.yaml", path)
    out = migrate_paths([str(path)], policies=str(ROOT / "policies"), policies_required=True,
                        strategy="extended-resource", write=True)
    # The pod keeps its limit; the class the form's GPU maps to must serve it (KEP-5004).
    assert path.read_text() == (KSERVE / "tensorflow-gpu.yaml").read_text()
    assert any("DeviceClass gpu.nvidia.com-a100 is not among these files: set spec.extendedResourceName: "
               "nvidia.com/gpu" in n for n in out.notes), out.notes


def test_an_over_long_machine_type_pins_nothing_and_is_not_echoed(tmp_path: Path) -> None:
    obj = yaml.safe_load((KSERVE / "tensorflow-gpu.yaml").read_text())
    obj["spec"]["predictor"]["nodeSelector"] = {"node.kubernetes.io/instance-type": "g5." + "x" * 100_000}
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(obj))
    out = migrate_paths([str(path)], policies=str(ROOT / "policies"), policies_required=True, strategy=None,
                        write=False)
    # Not a label value Kubernetes accepts: no refusal built on it, and no note carrying it.
    assert out.changed and all(len(n) < 1000 for n in out.notes)
