"""The local cluster's scenario manifests (webhook/dev/scenarios.py): each is what the API server accepts,
and each pod's claims are the ones its manifest makes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import yaml

from webhook.core.source import SourceObject
from webhook.dev import scenarios
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.model import PolicySet

SCENARIOS: dict[str, Callable[[], str]] = {
    "legacy_pod": lambda: scenarios.legacy_pod("ns"),
    "legacy_pod on a node": lambda: scenarios.legacy_pod("ns", "img", "node-a", "echo hi"),
    "claim_pod": lambda: scenarios.claim_pod("ns", "p", scenarios.A100, 2, "img", "node-a"),
    "shell_pod": lambda: scenarios.shell_pod("ns", "web", "img", "node-a"),
    "llm_template": lambda: scenarios.llm_template("ns", scenarios.H100),
    "big_a100_claim": lambda: scenarios.big_a100_claim("ns", 9),
    "training_claim": lambda: scenarios.training_claim("ns"),
    "training_claim on a node": lambda: scenarios.training_claim("ns", "img", "node-a", "run"),
    "plain_gpu_pod": lambda: scenarios.plain_gpu_pod("ns", "x"),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_is_well_formed(name: str) -> None:
    docs = list(yaml.safe_load_all(SCENARIOS[name]()))
    assert all(d["metadata"]["namespace"] == "ns" for d in docs)
    report = evaluate([SourceObject(d) for d in docs], PolicySet.empty(), Inventory.empty(), Context(),
                      rule_modules=("structure",))  # fmt: skip
    assert [f for f in report.findings if f.rule in ("structure/invalid", "structure/undeclared-claim")] == []
    made = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for pod in (d for d in docs if d["kind"] == "Pod"):
        spec = pod["spec"]
        assert spec["terminationGracePeriodSeconds"] == 1
        refs = {c["name"] for c in spec.get("resourceClaims", [])}
        for c in spec["containers"]:
            assert {r["name"] for r in c.get("resources", {}).get("claims", [])} <= refs
        for rc in spec.get("resourceClaims", []):
            kind = "ResourceClaim" if "resourceClaimName" in rc else "ResourceClaimTemplate"
            assert (kind, rc.get("resourceClaimName") or rc["resourceClaimTemplateName"]) in made


def test_command_and_node_pin_a_pod() -> None:
    (pod,) = yaml.safe_load_all(scenarios.shell_pod("ns", "web", "img", "node-a"))
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "node-a"}
    assert pod["spec"]["containers"][0]["command"] == ["sh", "-c", "exec sleep 3600"]
    _claim, train = yaml.safe_load_all(scenarios.training_claim("ns"))
    assert train["spec"]["containers"][0]["command"] == ["torchrun", "--nproc_per_node=4", "train.py"]
    assert train["spec"]["restartPolicy"] == "Never"
    (legacy,) = yaml.safe_load_all(scenarios.legacy_pod("ns"))
    assert legacy["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 2}}
