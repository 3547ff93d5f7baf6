"""A claim template and the Deployment that uses it in ONE `kubectl apply`, with no wait in between.

The webhook's watch learns of the template a moment after it is created; the Deployment arrives
milliseconds later. The webhook remembers what it has just admitted, so the A100 Deployment is
denied at the Deployment itself (not only later at its ReplicaSet), and the H100 one is admitted.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.helpers import Kubectl
from webhook.dev import scenarios
from webhook.dev.cluster import LocalCluster


def _require_webhook(cluster: LocalCluster) -> None:
    if "webhook" not in (cluster.state.get("pids") or {}):
        pytest.skip("the webhook is not part of this cluster (webhook/server missing)")


def test_template_and_deployment_in_one_apply(
    cluster: LocalCluster, kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    _require_webhook(cluster)
    ns = namespace("same-apply")
    manifest = (
        scenarios.llm_template(ns, scenarios.A100) + "---\n" + scenarios.llm_deployment(ns, scenarios.A100)
    )
    denied = kubectl.apply(manifest)
    assert denied.returncode != 0, denied.stdout
    assert 'admission webhook "workloads.validate.draguard.io" denied the request' in denied.stderr
    # Denied at the Deployment itself (draguard names the object it judged).
    assert f"draguard denied Deployment/{ns}/llm-inference-a100" in denied.stderr
    assert "[tier/gpu-tiers]" in denied.stderr and scenarios.A100 in denied.stderr
    # The template itself was admitted and created; the Deployment was not.
    assert "resourceclaimtemplate.resource.k8s.io/llm-a100 created" in denied.stdout
    assert kubectl.get("resourceclaimtemplate", "llm-a100", ns)["metadata"]["name"] == "llm-a100"
    assert kubectl.run("get", "deployment", "llm-inference-a100", "-n", ns).returncode != 0

    # The same shape with an in-tier class goes through in one apply.
    manifest = (
        scenarios.llm_template(ns, scenarios.H100) + "---\n" + scenarios.llm_deployment(ns, scenarios.H100)
    )
    admitted = kubectl.apply(manifest)
    assert admitted.returncode == 0, admitted.stderr
    assert kubectl.get("deployment", "llm-inference-h100", ns)["metadata"]["name"] == "llm-inference-h100"
