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
    ALL_MODE_LEAST,
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
    # Devices are counted as ResourceQuota counts them: All = 32 (AllocationResultsMaxSize) whatever
    # the inventory, firstAvailable = per class the largest subrequest, unknown modes 0.
    expected = {"gpu.nvidia.com": 3 + ALL_MODE_CHARGE + 1, "a100-mig-3g20gb": 2}
    assert claim_demand(spec, inventory) == expected
    assert claim_demand(spec, Inventory.empty()) == expected
    # GPU-equivalents count what the claim can get: All = the most matching devices on one node
    # (node-h has 4 full GPUs), firstAvailable = its largest alternative (2 x 3/7 < 1 full GPU).
    calc = QuotaCalculator(inventory)
    assert calc.claim_gpu_equivalents(spec) == 3 + 4 + 1 + 0
    assert calc.unknown_charges(spec) == []
    # Without an inventory, All is the one device it gets at least, and said to be a lower bound.
    blind = QuotaCalculator(Inventory.empty())
    assert blind.claim_gpu_equivalents(spec) == 3 + ALL_MODE_LEAST + 1
    [unknown] = blind.unknown_charges(spec)
    assert unknown.startswith("request 'b' takes every matching device of class gpu.nvidia.com")


def test_first_available_charged_as_its_largest_alternative(inventory: Inventory) -> None:
    spec = read_claim_spec(
        _claim([{"name": "g", "firstAvailable": [
            {"name": "h100", "deviceClassName": "gpu.nvidia.com-h100", "count": 1},
            {"name": "a100", "deviceClassName": "gpu.nvidia.com-a100", "count": 2},
        ]}])["spec"],
        "resource.k8s.io/v1",
    )  # fmt: skip
    calc = QuotaCalculator(Inventory.empty())
    # The claim gets 1 H100 or 2 A100s: at most 2 GPUs, not 3.
    assert calc.claim_gpu_equivalents(spec) == 2
    # Per class, as the ResourceQuota evaluator: both classes are charged their subrequest.
    assert calc.claim_demand(spec) == {"gpu.nvidia.com-h100": 1, "gpu.nvidia.com-a100": 2}


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
    assert "3 pods x 2 (nvidia.com/gpu)" in findings[0].message
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


# -- one charging rule: device plugins, KEP-5004, init containers, the default budget -------------

ROOT = Path(__file__).resolve().parents[2]


def _shipped() -> PolicySet:
    from webhook.policy.load import load_policies

    return load_policies(ROOT / "policies")


def _deployment(limits: dict[str, Any], replicas: int = 1, ns: str = "team-a",
                init: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "x", "resources": {"limits": limits}}]}
    if init is not None:
        spec["initContainers"] = [{"name": "prep", "image": "x", "resources": {"limits": init}}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "legacy", "namespace": ns},
        "spec": {"replicas": replicas, "template": {"spec": spec}},
    }  # fmt: skip


def test_device_plugin_gpus_are_charged_against_budgets() -> None:
    # 20 replicas x 8 nvidia.com/gpu in a team namespace with a 16 GPU-equivalent budget.
    findings = [f for f in _run([_deployment({"nvidia.com/gpu": 8}, replicas=20)], _shipped())
                if f.rule == "quota/team-budgets"]  # fmt: skip
    assert findings and all(f.mode is Mode.ENFORCE for f in findings)
    text = " ".join(f.message for f in findings)
    # Charged to the class the shipped MigrationPolicy maps nvidia.com/gpu to, as its migration would be.
    assert "160 devices of class gpu.nvidia.com-a100" in text
    assert "160 GPU-equivalents" in text
    assert "20 pods x 8 (nvidia.com/gpu, device plugin)" in text


def test_device_plugin_mig_slices_count_their_fraction() -> None:
    pols = _quota(QuotaBudget("namespace", "ml", gpu_equivalents=2.0))
    over = _run([_deployment({"nvidia.com/mig-3g.20gb": 5}, ns="ml")], pols)  # 15/7 > 2
    assert len(over) == 1 and "2.14 GPU-equivalents" in over[0].message
    assert _run([_deployment({"nvidia.com/mig-3g.20gb": 4}, ns="ml")], pols) == []  # 12/7


def test_init_container_gpus_are_reused_by_the_app() -> None:
    # Kubernetes' effective request: max(init 1, app 2) = 2, not 3.
    pols = _quota(QuotaBudget("namespace", "ml", gpu_equivalents=2.0))
    assert _run([_deployment({"nvidia.com/gpu": 2}, ns="ml", init={"nvidia.com/gpu": 1})], pols) == []
    over = _run([_deployment({"nvidia.com/gpu": 1}, ns="ml", init={"nvidia.com/gpu": 3})], pols)
    assert len(over) == 1 and "asks for 3 GPU-equivalents" in over[0].message


def test_effective_amounts_follow_kubernetes_sidecar_rules() -> None:
    from webhook.dra.workloads import effective_amounts

    spec = {
        "initContainers": [
            {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": 1}}},
            {"name": "prep", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
        ],
        "containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
    }
    # The sidecar keeps running: app + sidecar = 2; prep runs beside the sidecar: 2 + 1 = 3.
    assert effective_amounts(spec) == {"nvidia.com/gpu": 3}


def test_kep5004_extended_resources_are_charged_to_their_class() -> None:
    pod = _deployment({"deviceclass.resource.kubernetes.io/gpu.nvidia.com-h100": 9})
    findings = [f for f in _run([pod], _shipped()) if f.rule == "quota/team-budgets"]
    assert any("9 devices of class gpu.nvidia.com-h100" in f.message for f in findings)


def test_default_budget_covers_unlabelled_namespaces_only() -> None:
    claim = _claim([_exact("g", "gpu.nvidia.com-h100", 50)], ns="scratch")
    denied = [f for f in _run([claim], _shipped()) if f.rule == "quota/team-budgets"]
    assert denied and "namespace scratch" in denied[0].message and "budget" in denied[0].message
    # A team namespace is under its team budget, not the default one.
    team = _claim([_exact("g", "gpu.nvidia.com-h100", 9)], ns="scratch")
    labels = {"scratch": {"draguard.io/team": "ml"}}
    msgs = [f.message for f in _run([team], _shipped(), namespace_labels=labels)]
    assert msgs == [], msgs
    # A namespace a namespace budget names is not under the default (team-* has its own).
    small = _claim([_exact("g", "gpu.nvidia.com-a100", 8)], ns="team-x")
    assert _run([small], _shipped()) == []


def test_quota_render_says_what_it_leaves_out() -> None:
    notes = unrenderable(_shipped(), ["scratch"])
    assert any("default budget" in n for n in notes)
    assert any("device-plugin GPUs" in n for n in notes)
    # The default budget renders for a namespace given that no namespace budget names.
    rendered = render_resource_quotas(_shipped(), ["scratch", "team-a"])
    by_ns = {q["metadata"]["namespace"]: q["spec"]["hard"] for q in rendered}
    assert by_ns["scratch"] == {"count/resourceclaims.resource.k8s.io": "32"}
    assert by_ns["team-a"]["gpu.nvidia.com-a100.deviceclass.resource.k8s.io/devices"] == "8"


def test_only_gpu_driver_devices_count_as_gpu_equivalents() -> None:
    """A budget in GPU-equivalents counts GPUs: a class of another driver's devices (a NIC, an FPGA)
    charges no GPU-equivalents, while a MIG slice and a full GPU charge their fractions."""
    from fractions import Fraction

    from webhook.dra.device import Device
    from webhook.engine.quota import device_fraction

    def dev(driver: str, **attrs: str) -> Device:
        return Device(driver=driver, pool="p", name="d", node="n", attributes={driver: attrs}, capacity={})

    assert device_fraction(dev("gpu.nvidia.com", productName="NVIDIA H100 80GB HBM3")) == 1
    mig = dev("gpu.nvidia.com", type="mig", profile="3g.20gb", productName="NVIDIA A100-SXM4-40GB")
    assert device_fraction(mig) == Fraction(3, 7)
    assert device_fraction(dev("nic.example.com", model="cx7")) == 0


# -- sharing (KEP-5075) and partitions (KEP-4815) ------------------------------------------------

SHARING_INVENTORY = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: mig.nvidia.com}
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: shared}
spec:
  driver: gpu.nvidia.com
  pool: {name: node-a, generation: 1, resourceSliceCount: 1}
  nodeName: node-a
  devices:
  - name: gpu-0
    allowMultipleAllocations: true
    attributes: {type: {string: gpu}, productName: {string: NVIDIA H100 80GB HBM3}}
    capacity:
      memory:
        value: 80Gi
        requestPolicy: {default: 80Gi, validRange: {min: 10Gi, step: 10Gi}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: counters}
spec:
  driver: gpu.nvidia.com
  pool: {name: node-b, generation: 1, resourceSliceCount: 2}
  nodeName: node-b
  sharedCounters:
  - name: gpu-0-counters
    counters: {memory: {value: 80Gi}, multiprocessors: {value: "132"}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: partitions}
spec:
  driver: gpu.nvidia.com
  pool: {name: node-b, generation: 1, resourceSliceCount: 2}
  nodeName: node-b
  devices:
  - name: gpu-0-mig-3g40gb-0
    attributes:
      type: {string: mig}
      profile: {string: 3g.40gb}
      productName: {string: NVIDIA H100 80GB HBM3}
    capacity: {memory: {value: 40Gi}}
    consumesCounters:
    - counterSet: gpu-0-counters
      counters: {memory: {value: 40Gi}, multiprocessors: {value: "60"}}
"""


def _share(name: str, memory: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    if memory is not None:
        body["capacity"] = {"requests": {"memory": memory}}
    return _claim([{"name": "g", "exactly": body}], name=name)


def test_shares_of_one_gpu_are_charged_their_consumed_capacity() -> None:
    inv = Inventory.from_objects(list(yaml.safe_load_all(SHARING_INVENTORY)))
    u = compute_usage([_share("a", "10Gi"), _share("b", "10Gi")], {}, PolicySet.empty(), inv)
    assert u.gpu_equivalents["ml"] == pytest.approx(0.25)  # 2 x 10Gi of 80Gi, not 2 GPUs
    # Devices are still counted as ResourceQuota counts them: one per request.
    assert u.devices[("ml", "gpu.nvidia.com")] == 2
    # 15Gi is rounded up to the next 10Gi step; no request takes the policy's default (the whole GPU).
    calc = QuotaCalculator(inv)
    spec = read_claim_spec(_share("c", "15Gi")["spec"], "resource.k8s.io/v1")
    assert calc.claim_gpu_equivalents(spec) == Fraction(1, 4)
    whole = read_claim_spec(_share("d", None)["spec"], "resource.k8s.io/v1")
    assert calc.claim_gpu_equivalents(whole) == 1


def test_a_partition_is_charged_by_the_counters_it_consumes() -> None:
    inv = Inventory.from_objects(list(yaml.safe_load_all(SHARING_INVENTORY)))
    spec = read_claim_spec(_claim([_exact("p", "mig.nvidia.com")])["spec"], "resource.k8s.io/v1")
    # 40Gi of an 80Gi set and 60 of 132 multiprocessors: the larger share, 1/2.
    assert QuotaCalculator(inv).claim_gpu_equivalents(spec) == Fraction(1, 2)


def test_admin_access_claims_count_devices_but_no_gpu_equivalents() -> None:
    # Kubernetes' ResourceQuota evaluator does not exempt adminAccess requests from its device count;
    # neither does draguard. But admin access takes no device from anyone (it reaches devices in use
    # by others), so it holds no GPU-equivalents.
    inv = Inventory.from_objects(list(yaml.safe_load_all(SHARING_INVENTORY)))
    admin = _claim([{"name": "g", "exactly": {"deviceClassName": "mig.nvidia.com", "adminAccess": True}}])
    plain = _claim([_exact("g", "mig.nvidia.com")], name="p")
    u = compute_usage([admin, plain], {}, PolicySet.empty(), inv)
    assert u.devices[("ml", "mig.nvidia.com")] == 2
    assert u.gpu_equivalents["ml"] == pytest.approx(0.5)  # the plain claim's 1/2 of the counter set
