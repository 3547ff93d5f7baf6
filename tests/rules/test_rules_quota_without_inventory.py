"""Quota without an inventory: what review can count is charged, what it cannot is said to be unknown.

Built from real manifests of the corpus (the Kubernetes docs' `allocationMode: All` claim, GKE's
all-GPUs template, the DRA example driver's admin-access demo, NVIDIA's IMEX channel claims), with
the shipped policies: namespaces not named team-* get 8 GPU-equivalents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from webhook.core.findings import Finding, Mode, Severity
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.dra.objects import read_claim_spec
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.engine.quota import QuotaCalculator, pinned_drivers
from webhook.policy.load import load_policies

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus"
SHIPPED = load_policies(ROOT / "policies")


def _docs(rel: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((CORPUS / rel).read_text()) if isinstance(d, dict)]


def _quota(objs: list[dict[str, Any]], inventory: Inventory | None = None) -> list[Finding]:
    report = evaluate([SourceObject(o) for o in objs], SHIPPED, inventory or Inventory.empty(), Context(),
                      rule_modules=("quota",))
    return [f for f in report.findings if f.rule.startswith("quota/")]


def _spec(requests: list[dict[str, Any]]) -> Any:
    return read_claim_spec({"devices": {"requests": requests}}, "resource.k8s.io/v1")


def test_all_mode_is_a_lower_bound_not_32_gpus() -> None:
    # kubernetes/website: a v1 claim for all devices of example-device-class, in namespace default.
    [f] = _quota(_docs("kubernetes/website-dra-resourceclaim.yaml"))
    assert f.mode is Mode.AUDIT and f.severity is Severity.INFO
    assert "counted 1 GPU-equivalent(s)" in f.message and "a lower bound" in f.message
    assert "example-device-class" in f.message and "allocationMode All" in f.message
    assert "--inventory" in (f.fix or "")


def test_all_mode_in_a_workload_template_is_a_lower_bound() -> None:
    # GKE's compute class sample: a Deployment whose pod claims every GPU of its node.
    [f] = _quota(_docs("gke-samples/ccc-dra-all-gpus.yaml"))
    assert f.mode is Mode.AUDIT and "template all-gpus, 1 pod" in f.message


def test_all_mode_over_the_budget_is_still_denied_and_says_at_least() -> None:
    # 10 replicas of GKE's all-GPUs pod hold at least 10 GPUs whatever their nodes: over 8.
    docs = _docs("gke-samples/ccc-dra-all-gpus.yaml")
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    deploy["spec"]["replicas"] = 10
    [f] = _quota(docs)
    assert f.mode is Mode.ENFORCE and "asks for 10 GPU-equivalents" in f.message
    assert "at least: request 'gpu'" in f.message


def test_all_mode_with_an_inventory_counts_the_devices() -> None:
    # The example inventory has 8 H100s on its biggest node: All is those 8, and known.
    example = (ROOT / "examples" / "inventory.yaml").read_text()
    calc = QuotaCalculator(Inventory.from_objects(list(yaml.safe_load_all(example))))
    h100s = {"deviceClassName": "gpu.nvidia.com-h100", "allocationMode": "All"}
    spec = _spec([{"name": "g", "exactly": h100s}])
    assert calc.claim_gpu_equivalents(spec) == 8
    assert calc.unknown_charges(spec) == []


def test_admin_access_takes_no_gpus() -> None:
    # The DRA example driver's admin-access demo: All + adminAccess in a labelled namespace.
    assert _quota(_docs("dra-example-driver/admin-access.yaml")) == []
    calc = QuotaCalculator(Inventory.empty())
    spec = _spec([{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8,
                                            "adminAccess": True}}])
    assert calc.claim_gpu_equivalents(spec) == 0
    # The ResourceQuota device count still includes it, as the API server's evaluator does.
    assert calc.claim_demand(spec) == {"gpu.nvidia.com": 8}


def test_classes_of_other_drivers_charge_no_gpus() -> None:
    nic = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "rdma-nics"},
           "spec": {"selectors": [{"cel": {"expression": "device.driver == 'rdma.example.com'"}}]}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "nics", "namespace": "default"},
             "spec": {"devices": {"requests": [
                 {"name": "nic", "exactly": {"deviceClassName": "rdma-nics", "count": 16}}]}}}  # fmt: skip
    # 16 NICs are no GPUs: within the 8 GPU-equivalents (claims: 1 of 32).
    assert _quota([nic, claim]) == []
    # NVIDIA's IMEX channel class, installed by its chart and defined in no file: no GPU either.
    calc = QuotaCalculator(Inventory.empty())
    assert calc.class_fraction("compute-domain-default-channel.nvidia.com") == 0
    # The same 16 devices on a GPU class are 16 GPUs.
    claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    [f] = _quota([claim])
    assert f.mode is Mode.ENFORCE and "asks for 16 GPU-equivalents" in f.message


def test_pinned_drivers() -> None:
    assert pinned_drivers(["device.driver == 'a.example.com' && device.attributes['a'].x == 1"]) == {
        "a.example.com"}
    assert pinned_drivers(['"b.example.com" == device.driver']) == {"b.example.com"}
    # A disjunction or a negation pins nothing; a != comparison elsewhere does not hide a pin.
    assert pinned_drivers(["device.driver == 'a' || device.driver == 'b'"]) == frozenset()
    assert pinned_drivers(["!(device.driver == 'a')"]) == frozenset()
    assert pinned_drivers(["device.driver == 'gpu.nvidia.com' && device.attributes['x'].y != 'z'"]) == {
        "gpu.nvidia.com"}
