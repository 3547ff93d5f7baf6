"""GPU tiers: an LLM Deployment is denied A100s and admitted on H100s, whose pods are then scheduled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.e2e.helpers import Kubectl, wait_for
from webhook.dev import scenarios


def test_llm_deployment_a100_denied_h100_scheduled(kubectl: Kubectl, namespace: Callable[..., str]) -> None:
    ns = namespace("tiers")
    for cls in (scenarios.A100, scenarios.H100):
        made = kubectl.apply(scenarios.llm_template(ns, cls))
        assert made.returncode == 0, made.stderr
    a100 = scenarios.llm_deployment(ns, scenarios.A100)
    # The webhook resolves claim templates from its watch cache: wait until it has seen the new one
    # (server dry runs have no side effects), then apply for real.
    wait_for(lambda: kubectl.run("apply", "--dry-run=server", "-f", "-", input=a100).returncode != 0,
             "the webhook to know the new claim template", timeout=20)  # fmt: skip
    denied = kubectl.apply(a100)
    assert denied.returncode != 0
    assert 'admission webhook "workloads.validate.draguard.io" denied the request' in denied.stderr
    assert "[tier/gpu-tiers]" in denied.stderr
    assert scenarios.A100 in denied.stderr
    assert "Fix:" in denied.stderr
    assert kubectl.run("get", "deployment", "llm-inference-a100", "-n", ns).returncode != 0

    admitted = kubectl.apply(scenarios.llm_deployment(ns, scenarios.H100))
    assert admitted.returncode == 0, admitted.stderr

    def scheduled() -> list[dict[str, Any]]:
        pods = kubectl.items("pods", ns, "-l", "app=llm-inference-h100")
        done = [p for p in pods if p["spec"].get("nodeName") and p["status"].get("resourceClaimStatuses")]
        return done if len(done) == 2 else []

    pods = wait_for(scheduled, "both H100 replicas scheduled", timeout=90)
    devices = set()
    for pod in pods:
        [status] = pod["status"]["resourceClaimStatuses"]
        claim = kubectl.get("resourceclaim", status["resourceClaimName"], ns)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == scenarios.DRIVER
        assert result["pool"] == pod["spec"]["nodeName"] == "gpu-h100-0"
        devices.add(result["device"])
    assert len(devices) == 2, "each replica got its own GPU"
