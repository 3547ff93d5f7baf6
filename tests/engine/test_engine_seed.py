"""The article's manifests through the whole engine: each of its mistakes is caught, at the right line."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import SEED

from webhook.core.findings import Finding, Mode, Report
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import source_objects
from webhook.policy.model import PolicySet

SEED_FILES = (
    "deviceclasses.yaml",
    "training-claim.yaml",
    "inference-deployment.yaml",
    "inline-pod.yaml",
    "legacy-pod.yaml",
)
OWN = ("structure/", "tier/")

# (file, object, rule) for the rules this part owns: exactly these, nothing else.
EXPECTED_OWN = {
    ("deviceclasses.yaml", "DeviceClass/gpu.nvidia.com-a100", "structure/deprecated-version"),
    ("deviceclasses.yaml", "DeviceClass/gpu.nvidia.com-h100", "structure/deprecated-version"),
    ("deviceclasses.yaml", "DeviceClass/gpu.nvidia.com-a100-mig-3g20gb", "structure/deprecated-version"),
    ("training-claim.yaml", "ResourceClaim/ml-workloads/training-gpu-claim", "structure/deprecated-version"),
    ("training-claim.yaml", "ResourceClaim/ml-workloads/training-gpu-claim", "structure/interconnect"),
    ("inference-deployment.yaml", "Deployment/ml-workloads/llm-inference-service", "tier/gpu-tiers"),
    (
        "inference-deployment.yaml",
        "ResourceClaimTemplate/ml-workloads/mig-inference-template",
        "structure/deprecated-version",
    ),
    (
        "inference-deployment.yaml",
        "ResourceClaimTemplate/ml-workloads/mig-inference-template",
        "structure/unsatisfiable",
    ),
    ("inline-pod.yaml", "Pod/ml-workloads/quick-gpu-job", "structure/inline-source"),
}
# Findings of the other rule families that the article's mistakes must also raise.
EXPECTED_OTHERS = {
    ("deviceclasses.yaml", "DeviceClass/gpu.nvidia.com-a100-mig-3g20gb", "cel/unknown-attribute"),
    ("deviceclasses.yaml", "DeviceClass/gpu.nvidia.com-a100", "config/opaque"),
    ("deviceclasses.yaml", "DeviceClass/gpu.nvidia.com-h100", "config/opaque"),
    ("legacy-pod.yaml", "Pod/default/gpu-training-legacy", "migrate/legacy-gpu"),
}


def seed_objects() -> list[SourceObject]:
    out: list[SourceObject] = []
    for name in SEED_FILES:
        out.extend(source_objects((SEED / name).read_text(encoding="utf-8"), str(SEED / name)))
    return out


def key(f: Finding) -> tuple[str, str, str]:
    return (Path(f.file or "").name, str(f.object), f.rule)


@pytest.fixture(scope="module")
def report(seed_inventory: Inventory, shipped: PolicySet) -> Report:
    return evaluate(seed_objects(), shipped, seed_inventory, Context())


def test_own_rules_find_exactly_the_articles_mistakes(report: Report) -> None:
    own = {key(f) for f in report.findings if f.rule.startswith(OWN)}
    assert own == EXPECTED_OWN


def test_other_rule_families_catch_their_mistakes(report: Report) -> None:
    got = {key(f) for f in report.findings}
    missing = EXPECTED_OTHERS - got
    assert not missing, f"not reported: {sorted(missing)}"


def test_no_rule_crashed(report: Report) -> None:
    assert [f.message for f in report.findings if f.rule.startswith("internal/")] == []


def _one(report: Report, rule: str, obj: str) -> Finding:
    hits = [f for f in report.findings if f.rule == rule and str(f.object) == obj]
    assert len(hits) == 1, hits
    return hits[0]


def test_nvlink_constraint_points_at_the_line_and_suggests_nvlink_domain(report: Report) -> None:
    f = _one(report, "structure/interconnect", "ResourceClaim/ml-workloads/training-gpu-claim")
    text = (SEED / "training-claim.yaml").read_text(encoding="utf-8").splitlines()
    assert f.line is not None and "nvlinkInterconnect" in text[f.line - 1]
    assert f.mode is Mode.ENFORCE
    assert "gpu.nvidia.com/nvlinkDomain" in f.fix


def test_inline_source_generates_a_claim_template_with_the_same_request(report: Report) -> None:
    f = _one(report, "structure/inline-source", "Pod/ml-workloads/quick-gpu-job")
    text = (SEED / "inline-pod.yaml").read_text(encoding="utf-8").splitlines()
    assert f.line is not None and text[f.line - 1].strip() == "source:"
    (tmpl,) = f.generated
    assert tmpl["kind"] == "ResourceClaimTemplate"
    assert tmpl["apiVersion"] == "resource.k8s.io/v1"
    assert tmpl["metadata"]["namespace"] == "ml-workloads"
    req = tmpl["spec"]["spec"]["devices"]["requests"][0]
    assert req == {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-h100", "count": 1}}
    assert f"resourceClaimTemplateName: {tmpl['metadata']['name']}" in f.fix


def test_tier_names_the_class_the_reason_and_the_template(report: Report) -> None:
    f = _one(report, "tier/gpu-tiers", "Deployment/ml-workloads/llm-inference-service")
    assert "'llm'" in f.message and "app=llm-inference" in f.message
    assert "gpu.nvidia.com-a100-mig-3g20gb" in f.message and "mig-inference-template" in f.message
    assert "deviceClassName: gpu.nvidia.com-h100" in f.fix
    assert f.mode is Mode.ENFORCE


def test_unsatisfiable_only_with_an_inventory(shipped: PolicySet) -> None:
    r = evaluate(seed_objects(), shipped, Inventory.empty(), Context(), rule_modules=("structure",))
    assert not [f for f in r.findings if f.rule == "structure/unsatisfiable"]
    # The unknown constraint attribute is still caught from the driver schema alone.
    f = _one(r, "structure/interconnect", "ResourceClaim/ml-workloads/training-gpu-claim")
    assert "driver schema" in f.message


def test_v1beta1_is_accepted_silently_where_v1_is_not_served(shipped: PolicySet) -> None:
    ctx = Context(served_versions=frozenset({"v1beta1"}))
    r = evaluate(seed_objects(), shipped, Inventory.empty(), ctx, rule_modules=("structure",))
    assert not [f for f in r.findings if f.rule == "structure/deprecated-version"]
