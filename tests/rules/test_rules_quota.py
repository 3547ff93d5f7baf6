"""Quota arithmetic and the `quota/<policy>` rule: static and live, namespaces and teams."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.findings import Finding, Mode, Severity
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.dra.objects import read_claim_spec
from webhook.engine.context import Context, QuotaUsage
from webhook.engine.evaluate import evaluate
from webhook.engine.quota import (
    ALL_MODE_CHARGE,
    QuotaCalculator,
    claim_demand,
    compute_usage,
    gpu_equivalents,
    mig_fraction,
    render_resource_quotas,
    unrenderable,
)
from webhook.policy.model import GpuQuotaPolicy, PolicySet, QuotaBudget

MIG = "gpu.nvidia.com-a100-mig-3g20gb"  # the seed's MIG class name


def _claim(
    requests: list[dict[str, Any]], ns: str = "ml", name: str = "c", version: str = "resource.k8s.io/v1"
) -> dict[str, Any]:
    return {
        "apiVersion": version,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": requests}},
    }


def _exact(name: str, cls: str, count: int | None = None, mode: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls}
    if count is not None:
        body["count"] = count
    if mode:
        body["allocationMode"] = mode
    return {"name": name, "exactly": body}


def _quota(*budgets: QuotaBudget, mode: Mode = Mode.ENFORCE, name: str = "gpus") -> PolicySet:
    return PolicySet(quota=(GpuQuotaPolicy(name=name, budgets=budgets, mode=mode),))


def _run(
    objs: list[dict[str, Any]], pols: PolicySet, inventory: Inventory | None = None, **ctx: Any
) -> list[Finding]:
    r = evaluate(
        [SourceObject(o) for o in objs],
        pols,
        inventory or Inventory.empty(),
        Context(**ctx),
        rule_modules=("quota",),
    )
    assert not [f for f in r.findings if f.rule.startswith("internal/")], r.findings
    return r.findings


# -- arithmetic ---------------------------------------------------------------------------------


def test_mig_fractions() -> None:
    assert mig_fraction("3g.20gb") == Fraction(3, 7)
    assert mig_fraction("1g.10gb+me") == Fraction(1, 7)
    assert mig_fraction("7g.80gb") == 1
    assert mig_fraction("2g.12gb", "NVIDIA A30") == Fraction(1, 2)
    assert mig_fraction("bogus") is None


def test_counting_rules(inventory: Inventory) -> None:
    spec = read_claim_spec(
        _claim(
            [
                _exact("a", "gpu.nvidia.com", 3),
                _exact("b", "gpu.nvidia.com", mode="All"),
                {
                    "name": "c",
                    "firstAvailable": [
                        {"name": "big", "deviceClassName": "a100-mig-3g20gb", "count": 2},
                        {"name": "small", "deviceClassName": "a100-mig-3g20gb", "count": 1},
                        {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 1},
                    ],
                },
                _exact("d", "gpu.nvidia.com", 1, mode="Sometimes"),
            ]
        )["spec"],
        "resource.k8s.io/v1",
    )
    # All = the most devices of the class on one node (node-h has 4 full GPUs).
    assert claim_demand(spec, inventory) == {"gpu.nvidia.com": 3 + 4 + 1, "a100-mig-3g20gb": 2}
    # Without an inventory All is charged like the API server's quota: 32.
    assert claim_demand(spec, Inventory.empty()) == {
        "gpu.nvidia.com": 3 + ALL_MODE_CHARGE + 1,
        "a100-mig-3g20gb": 2,
    }


def test_v1beta1_claims_count_the_same(inventory: Inventory) -> None:
    flat = read_claim_spec(
        {"devices": {"requests": [{"name": "g", "deviceClassName": "gpu.nvidia.com", "count": 2}]}},
        "resource.k8s.io/v1beta1",
    )
    assert claim_demand(flat, inventory) == {"gpu.nvidia.com": 2}


def test_gpu_equivalents(inventory: Inventory) -> None:
    assert gpu_equivalents("a100-mig-3g20gb", 7, inventory) == pytest.approx(3.0)
    assert gpu_equivalents("gpu.nvidia.com-h100", 2, inventory) == 2.0
    # No inventory: the seed's MIG class name still tells the profile.
    assert gpu_equivalents(MIG, 6, Inventory.empty()) == pytest.approx(18 / 7)
    assert gpu_equivalents("unknown", 2, Inventory.empty()) == 2.0


def test_compute_usage_namespaces_and_teams(inventory: Inventory) -> None:
    claims = [
        _claim([_exact("g", "gpu.nvidia.com", 2)], ns="a"),
        _claim([_exact("m", "a100-mig-3g20gb", 1)], ns="a", name="d"),
        _claim([_exact("g", "gpu.nvidia.com", 1)], ns="b"),
        {"kind": "ConfigMap", "metadata": {"namespace": "a"}},
        # As a raw API list item: no apiVersion/kind.
        {
            "metadata": {"namespace": "c"},
            "spec": {"devices": {"requests": [_exact("g", "gpu.nvidia.com", 1)]}},
        },
    ]
    labels = {"a": {"draguard.io/team": "red"}, "b": {"draguard.io/team": "red"}}
    u = compute_usage(claims, labels, PolicySet.empty(), inventory)
    assert u.devices[("a", "gpu.nvidia.com")] == 2
    assert u.devices[("team:red", "gpu.nvidia.com")] == 3
    assert u.gpu_equivalents["a"] == pytest.approx(2 + 3 / 7)
    assert u.gpu_equivalents["team:red"] == pytest.approx(3 + 3 / 7)
    assert u.claims == {"a": 2, "team:red": 3, "b": 1, "c": 1}


def test_calculator_reuses_matches(inventory: Inventory) -> None:
    calc = QuotaCalculator(inventory)
    first = calc.matching("gpu.nvidia.com")
    assert first is calc.matching("gpu.nvidia.com")
    assert calc.matching("no-such-class") is None


# -- the rule: static ----------------------------------------------------------------------------


def test_seed_deployment_over_namespace_budget(seed_deployment: list[dict[str, Any]]) -> None:
    pols = _quota(QuotaBudget("namespace", "ml-*", {MIG: 4}))
    findings = _run(seed_deployment, pols)
    assert len(findings) == 1
    f = findings[0]
    assert f.rule == "quota/gpus" and f.mode is Mode.ENFORCE and f.severity is Severity.ERROR
    assert f.object.kind == "Deployment"
    assert "6 devices of class" in f.message and "6 pods x 1 (template mig-inference-template)" in f.message
    assert "is 4" in f.message and "replica" in f.fix


def test_seed_deployment_within_budget(seed_deployment: list[dict[str, Any]]) -> None:
    assert _run(seed_deployment, _quota(QuotaBudget("namespace", "ml-workloads", {MIG: 6}))) == []


def test_gpu_equivalent_budget(seed_deployment: list[dict[str, Any]]) -> None:
    # 6 x 3g.20gb = 18/7 = 2.57 GPUs.
    over = _run(seed_deployment, _quota(QuotaBudget("namespace", "*", gpu_equivalents=2.5)))
    assert len(over) == 1 and "2.57 GPU-equivalents" in over[0].message
    assert _run(seed_deployment, _quota(QuotaBudget("namespace", "*", gpu_equivalents=2.6))) == []


def test_claim_count_budget(seed_deployment: list[dict[str, Any]]) -> None:
    findings = _run(seed_deployment, _quota(QuotaBudget("namespace", "*", claims=5)))
    assert len(findings) == 1 and "6 ResourceClaims" in findings[0].message


def test_warn_mode_and_class_glob() -> None:
    claim = _claim([_exact("g", "gpu.nvidia.com-h100", 3), _exact("h", "gpu.nvidia.com-a100", 2)])
    findings = _run([claim], _quota(QuotaBudget("namespace", "ml", {"gpu.nvidia.com-*": 4}), mode=Mode.WARN))
    assert len(findings) == 1
    assert findings[0].mode is Mode.WARN and findings[0].severity is Severity.WARNING
    assert "5 devices" in findings[0].message


def test_other_namespace_and_templates_are_not_charged(seed_deployment: list[dict[str, Any]]) -> None:
    pols = _quota(QuotaBudget("namespace", "other", {MIG: 0}))
    assert _run(seed_deployment, pols) == []
    template_only = [o for o in seed_deployment if o["kind"] == "ResourceClaimTemplate"]
    assert _run(template_only, _quota(QuotaBudget("namespace", "*", {MIG: 0}))) == []


def test_shared_claim_is_charged_once() -> None:
    claim = _claim([_exact("g", "gpu.nvidia.com", 4)], ns="ml", name="shared")
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ml"},
        "spec": {
            "replicas": 10,
            "template": {
                "spec": {
                    "containers": [{"name": "c", "resources": {"claims": [{"name": "g"}]}}],
                    "resourceClaims": [{"name": "g", "resourceClaimName": "shared"}],
                }
            },
        },
    }
    findings = _run([claim, dep], _quota(QuotaBudget("namespace", "ml", {"gpu.nvidia.com": 4})))
    assert findings == []


def test_job_parallelism_and_extended_resources(inventory: Inventory) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ml"},
        "spec": {
            "parallelism": 3,
            "template": {
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}
            },
        },
    }
    # The inventory's gpu.nvidia.com class serves nvidia.com/gpu (KEP-5004): 3 pods x 2.
    findings = _run([job], _quota(QuotaBudget("namespace", "ml", {"gpu.nvidia.com": 5})), inventory)
    assert len(findings) == 1 and "6 devices" in findings[0].message
    assert "3 pods x 2 (nvidia.com/gpu in c)" in findings[0].message
    # Without a class serving the name, the device plugin serves it: no DRA budget applies.
    assert _run([job], _quota(QuotaBudget("namespace", "ml", {"gpu.nvidia.com": 5}))) == []


def test_team_budget_needs_namespace_labels() -> None:
    claim = _claim([_exact("g", "gpu.nvidia.com", 3)], ns="red-a")
    pols = _quota(QuotaBudget("team", "*", {"gpu.nvidia.com": 2}))
    assert _run([claim], pols) == []  # no labels known: the team is unknown
    findings = _run([claim], pols, namespace_labels={"red-a": {"draguard.io/team": "red"}})
    assert len(findings) == 1 and "team red" in findings[0].message


# -- the rule: live -----------------------------------------------------------------------------


def test_live_usage_denies_when_total_exceeds() -> None:
    claim = _claim([_exact("g", "gpu.nvidia.com", 2)], ns="ml")
    pols = _quota(QuotaBudget("namespace", "ml", {"gpu.nvidia.com": 4}, gpu_equivalents=10, claims=10))
    usage = QuotaUsage(devices={("ml", "gpu.nvidia.com"): 3}, gpu_equivalents={"ml": 3.0}, claims={"ml": 1})
    findings = _run([claim], pols, usage=usage, admission=True, operation="CREATE")
    assert len(findings) == 1
    assert (
        "would bring namespace ml to 5 devices of class gpu.nvidia.com (in use 3 + this 2"
        in findings[0].message
    )
    # Fits exactly: no finding.
    usage2 = QuotaUsage(devices={("ml", "gpu.nvidia.com"): 2})
    assert _run([claim], pols, usage=usage2, operation="CREATE") == []
    # UPDATE never re-charges.
    assert _run([claim], pols, usage=usage, operation="UPDATE") == []


def test_live_team_usage() -> None:
    claim = _claim([_exact("g", "gpu.nvidia.com", 1)], ns="red-b")
    pols = _quota(QuotaBudget("team", "red", gpu_equivalents=4))
    usage = QuotaUsage(gpu_equivalents={"team:red": 3.5})
    labels = {"red-b": {"draguard.io/team": "red"}}
    findings = _run([claim], pols, usage=usage, namespace_labels=labels, operation="CREATE")
    assert len(findings) == 1 and "GPU-equivalents" in findings[0].message


# -- ResourceQuota rendering -------------------------------------------------------------------


def test_render_resource_quotas() -> None:
    pols = PolicySet(
        quota=(
            GpuQuotaPolicy(
                name="gpus",
                budgets=(
                    QuotaBudget(
                        "namespace",
                        "ml-workloads",
                        {MIG: 6, "gpu.nvidia.com-*": 2},
                        gpu_equivalents=3,
                        claims=8,
                    ),
                    QuotaBudget("namespace", "team-*", {"gpu.nvidia.com": 1}),
                    QuotaBudget("team", "red", {"gpu.nvidia.com": 1}),
                ),
            ),
            GpuQuotaPolicy(name="tight", budgets=(QuotaBudget("namespace", "ml-workloads", {MIG: 4}),)),
        )
    )
    quotas = render_resource_quotas(pols, namespaces=["team-a", "default"])
    by = {(q["metadata"]["namespace"], q["metadata"]["name"]): q for q in quotas}
    assert set(by) == {
        ("ml-workloads", "draguard-gpus"),
        ("ml-workloads", "draguard-tight"),
        ("team-a", "draguard-gpus"),
    }
    hard = by[("ml-workloads", "draguard-gpus")]["spec"]["hard"]
    assert hard == {
        f"{MIG}.deviceclass.resource.k8s.io/devices": "6",
        "count/resourceclaims.resource.k8s.io": "8",
    }
    assert (
        by[("ml-workloads", "draguard-gpus")]["metadata"]["labels"]["app.kubernetes.io/managed-by"]
        == "draguard"
    )
    assert by[("team-a", "draguard-gpus")]["spec"]["hard"] == {
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "1"
    }
    notes = "\n".join(unrenderable(pols))
    assert "team budgets span namespaces" in notes
    assert "gpuEquivalents 3" in notes and "'gpu.nvidia.com-*'" in notes
    assert "team-*" in notes  # no namespaces given to unrenderable(): the glob matched nothing


def test_inline_source_claims_are_not_charged(seed_dir: Path) -> None:
    # The seed's inline `source` pod gets no device from the API server, so it charges nothing.
    inline = [d for d in yaml.safe_load_all((seed_dir / "inline-pod.yaml").read_text()) if d]
    assert _run(inline, _quota(QuotaBudget("namespace", "*", {"*": 0}, gpu_equivalents=0, claims=0))) == []


@pytest.mark.parametrize(
    ("mode", "severity"),
    [(Mode.ENFORCE, Severity.ERROR), (Mode.WARN, Severity.WARNING), (Mode.AUDIT, Severity.INFO)],
)
def test_policy_mode_sets_finding_mode(mode: Mode, severity: Severity) -> None:
    claim = _claim([_exact("g", "gpu.nvidia.com", 3)])
    findings = _run([claim], _quota(QuotaBudget("namespace", "ml", {"gpu.nvidia.com": 2}), mode=mode))
    assert [(f.mode, f.severity) for f in findings] == [(mode, severity)]
