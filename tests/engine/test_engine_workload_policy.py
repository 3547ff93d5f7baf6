"""WorkloadKindPolicy: workload CRDs added to the built-in table in policy, read by review, admission
and migration alike, and the errors a bad entry gets."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.dra.workloads import CRD_POD_TEMPLATES, crd_table, pod_templates_of, using_crd_table
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import PolicyError, load_policies, parse_policy_text
from webhook.policy.model import PolicySet

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = load_policies(ROOT / "policies")
HEAD = "apiVersion: policy.draguard.io/v1alpha1\n"

MXJOB_POLICY = (ROOT / "tests" / "fixtures" / "workload-kinds" / "mxjob.yaml").read_text()
WITH_MX = SHIPPED.merged(parse_policy_text(MXJOB_POLICY, "mx.yaml"))


def _mxjob(workers: int, gpus: int, image: str = "nvcr.io/nvidia/pytorch:24.01-py3") -> dict[str, Any]:
    def pod(n: int) -> dict[str, Any]:
        c: dict[str, Any] = {"name": "main", "image": image}
        if n:
            c["resources"] = {"limits": {"nvidia.com/gpu": n}}
        return {"spec": {"containers": [c]}}

    return {
        "apiVersion": "kubeflow.org/v1", "kind": "MXJob",
        "metadata": {"name": "allreduce", "namespace": "team-ml"},
        "spec": {"mxReplicaSpecs": {"Scheduler": {"replicas": 1, "template": pod(0)},
                                     "Worker": {"replicas": workers, "template": pod(gpus)}}},
    }  # fmt: skip


def test_policy_declared_templates_are_read_with_their_replicas() -> None:
    obj = _mxjob(workers=3, gpus=8)
    assert pod_templates_of(obj) == []  # not in the built-in table
    with using_crd_table(WITH_MX.crd_table):
        got = [(t.pointer, t.replicas) for t in pod_templates_of(obj)]
    assert got == [("/spec/mxReplicaSpecs/Scheduler/template/spec", 1),
                   ("/spec/mxReplicaSpecs/Worker/template/spec", 3)]  # fmt: skip
    # The built-in entries are still there.
    assert set(CRD_POD_TEMPLATES) < set(WITH_MX.crd_table)


def test_quota_charges_a_policy_declared_crd() -> None:
    # The shipped budgets of team-ml: 8 A100s, 16 GPU-equivalents for team-*. 3 workers x 8 GPUs are
    # over both, 1 x 8 is within them.
    def over(obj: dict[str, Any], policies: PolicySet) -> list[str]:
        report = evaluate([SourceObject(obj)], policies, Inventory.empty(), Context(),
                          rule_modules=("quota",))
        return [f.message for f in report.findings if f.rule == "quota/team-budgets"]

    assert any("asks for 24 GPU-equivalents" in m for m in over(_mxjob(3, 8), WITH_MX))
    assert over(_mxjob(1, 8), WITH_MX) == []
    # Without the policy the kind is unknown to draguard: ignored, as any other CRD.
    report = evaluate([SourceObject(_mxjob(3, 8))], SHIPPED, Inventory.empty(), Context())
    assert report.findings == [] and report.ignored == 1


def test_tier_rule_judges_a_policy_declared_crd() -> None:
    obj = _mxjob(2, 1, image="vllm/vllm-openai:v0.6.0")
    tmpl = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "a100", "namespace": "team-ml"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com-a100"}}]}}}}  # fmt: skip
    worker = obj["spec"]["mxReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    worker["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "a100"}]
    report = evaluate([SourceObject(tmpl), SourceObject(obj)], WITH_MX, Inventory.empty(), Context())
    tier = [f for f in report.findings if f.rule == "tier/gpu-tiers"]
    assert tier and tier[0].object.kind == "MXJob" and "gpu.nvidia.com-a100" in tier[0].message


def test_migration_rewrites_every_template_of_a_policy_declared_crd() -> None:
    obj = _mxjob(2, 4)
    ctx = Context(namespace_labels={"team-ml": {"draguard.io/migration-mode": "migrate"}}, admission=True)
    report = evaluate([SourceObject(obj)], WITH_MX, Inventory.empty(), ctx, rule_modules=("migrate",))
    patches = [op for f in report.findings if f.patch for op in f.patch]
    assert patches
    spec = jsonpatch.apply_patch(obj, patches)["spec"]["mxReplicaSpecs"]["Worker"]["template"]["spec"]
    assert spec["resourceClaims"] and "limits" not in spec["containers"][0]["resources"]


def test_an_entry_replaces_the_built_in_one_for_its_kind() -> None:
    ps = parse_policy_text(HEAD + """kind: WorkloadKindPolicy
metadata: {name: pytorch-v2}
spec:
  kinds:
  - apiGroup: kubeflow.org
    kind: PyTorchJob
    templates: [{path: spec/replicas/*/pod/spec}]
""")
    obj = {"apiVersion": "kubeflow.org/v2", "kind": "PyTorchJob", "metadata": {"name": "p"},
           "spec": {"replicas": {"w": {"pod": {"spec": {"containers": [{"name": "c"}]}}}}}}  # fmt: skip
    with using_crd_table(ps.crd_table):
        assert [t.pointer for t in pod_templates_of(obj)] == ["/spec/replicas/w/pod/spec"]


def test_the_table_never_outlives_its_evaluation() -> None:
    """One evaluation's policies never decide how another (later, or on another thread) reads CRDs."""
    evaluate([SourceObject(_mxjob(3, 8))], WITH_MX, Inventory.empty(), Context())
    assert crd_table() is CRD_POD_TEMPLATES
    seen: list[int] = []
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        inside.wait(5)
        seen.append(len(pod_templates_of(_mxjob(1, 1))))
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with using_crd_table(WITH_MX.crd_table):
        inside.set()
        assert release.wait(5)
        assert len(pod_templates_of(_mxjob(1, 1))) == 2
    t.join(5)
    assert seen == [0]


def _kinds(entry: str) -> str:
    return HEAD + "kind: WorkloadKindPolicy\nmetadata: {name: w}\nspec:\n  kinds:\n" + entry


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (_kinds("  - {apiGroup: kubeflow.org, kind: MXJob}\n"), "spec.kinds[0]", "templates"),
        (_kinds("  - {apiGroup: volcano, kind: V, templates: [{path: spec}]}\n"),
         "spec.kinds[0].apiGroup", "does not match"),
        (_kinds("  - {apiGroup: a.io, kind: mpijob, templates: [{path: spec}]}\n"),
         "spec.kinds[0].kind", "does not match"),
        (_kinds("  - {apiGroup: a.io, kind: M, templates: [{path: 'spec//template'}]}\n"),
         "spec.kinds[0].templates[0].path", "does not match"),
        (_kinds("  - {apiGroup: a.io, kind: M, templates: [{path: spec, replica: [x]}]}\n"),
         "spec.kinds[0].templates[0]", "replica"),
        (_kinds("  - {apiGroup: a.io, kind: M, templates: []}\n"), "spec.kinds[0].templates", ""),
        (_kinds("  - {apiGroup: batch.volcano.sh, kind: Job, templates: [{path: spec/tasks/*/spec}]}\n"),
         "spec.kinds[0].kind", "built-in kind name"),
        (_kinds("  - {apiGroup: resource.k8s.io, kind: Claimish, templates: [{path: spec}]}\n"),
         "spec.kinds[0].apiGroup", "reserved for Kubernetes"),
        (_kinds("  - {apiGroup: a.io, kind: M, templates: [{path: spec/t/spec, replicas: [./n]}]}\n"),
         "spec.kinds[0].templates[0].replicas[0]", "no `*` element"),
        (_kinds("  - {apiGroup: a.io, kind: M, templates: [{path: spec}]}\n"
                "  - {apiGroup: a.io, kind: M, templates: [{path: spec/x}]}\n"),
         "spec.kinds[1]", "a.io/M twice"),
    ],
)  # fmt: skip
def test_bad_entries_name_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy_text(text, "kinds.yaml")
    assert e.value.file == "kinds.yaml" and e.value.field_path == field
    assert e.value.line is not None
    assert words in str(e.value)


def test_the_same_crd_in_two_documents_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(MXJOB_POLICY)
    (tmp_path / "b.yaml").write_text(MXJOB_POLICY.replace("name: mx", "name: mx-again"))
    want = r"b.yaml:\d+: spec.kinds: .*kubeflow.org/MXJob.*'mx' lists already"
    with pytest.raises(PolicyError, match=want):
        load_policies(tmp_path)
