"""Webhook down: mutating hooks fail open, validating ones fail closed, kube-system is never blocked.

The test stops the session's webhook and starts it again (on a new port, re-registered) afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import Kubectl
from webhook.dev import scenarios
from webhook.dev.cluster import LocalCluster


@pytest.fixture
def webhook_down(cluster: LocalCluster) -> Iterator[None]:
    if "webhook" not in (cluster.state.get("pids") or {}):
        pytest.skip("the webhook is not part of this cluster (webhook/server missing)")
    assert cluster.stop("webhook")
    try:
        yield
    finally:
        cluster.start_webhook(Path(cluster.state["policies"]))


def _set_validating_failure_policy(kubectl: Kubectl, policy: str) -> None:
    cfg = kubectl.get("validatingwebhookconfiguration", "draguard")
    patch = [
        {"op": "replace", "path": f"/webhooks/{i}/failurePolicy", "value": policy}
        for i in range(len(cfg["webhooks"]))
    ]
    kubectl.ok("patch", "validatingwebhookconfiguration", "draguard", "--type=json", "-p", json.dumps(patch))


def test_webhook_down(
    cluster: LocalCluster, kubectl: Kubectl, namespace: Callable[..., str], webhook_down: None
) -> None:
    ns = namespace("down")
    # A pod without GPUs never reaches the webhook (matchConditions), so it is created as usual.
    plain = kubectl.run("run", "plain", "-n", ns, "--image=registry.k8s.io/pause:3.10", "--restart=Never")
    assert plain.returncode == 0, plain.stderr

    # A GPU pod: the mutating webhook (failurePolicy Ignore) is skipped; the validating one fails closed.
    gpu = kubectl.apply(scenarios.plain_gpu_pod(ns))
    assert gpu.returncode != 0
    assert "pods.validate.draguard.io" in gpu.stderr
    assert "pods.mutate.draguard.io" not in gpu.stderr
    assert "failed calling webhook" in gpu.stderr

    # kube-system is excluded by name: GPU pods there are admitted with the webhook down.
    system = kubectl.apply(scenarios.plain_gpu_pod("kube-system", "system-gpu-pod"))
    try:
        assert system.returncode == 0, system.stderr
        assert kubectl.get("pod", "system-gpu-pod", "kube-system")["metadata"]["name"] == "system-gpu-pod"
    finally:
        kubectl.run("delete", "pod,resourceclaimtemplate", "-n", "kube-system", "system-gpu-pod",
                    "system-gpu-pod-h100", "--wait=false", "--ignore-not-found")  # fmt: skip

    # Fail-open validation (the fail-open-validation component): now only the mutating path is left,
    # it is ignored too, and the pod is created unchanged.
    _set_validating_failure_policy(kubectl, "Ignore")
    admitted = kubectl.apply(scenarios.plain_gpu_pod(ns, "gpu-pod-open"))
    assert admitted.returncode == 0, admitted.stderr
    assert kubectl.get("pod", "gpu-pod-open", ns)["spec"]["resourceClaims"][0]["name"] == "gpu"


def test_webhook_restored_after_restart(
    cluster: LocalCluster, kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    """Runs after test_webhook_down: the restarted webhook is registered again, failing closed."""
    if "webhook" not in (cluster.state.get("pids") or {}):
        pytest.skip("the webhook is not part of this cluster (webhook/server missing)")
    port = cluster.state["ports"]["webhook"]
    cfg = kubectl.get("validatingwebhookconfiguration", "draguard")
    # Failing closed again, except DeviceClasses, whose entry always fails open (admin objects).
    policies = {h["name"]: h["failurePolicy"] for h in cfg["webhooks"]}
    assert policies.pop("deviceclasses.validate.draguard.io") == "Ignore"
    assert set(policies.values()) == {"Fail"}
    assert {h["clientConfig"]["url"].split("/")[2] for h in cfg["webhooks"]} == {f"127.0.0.1:{port}"}
    ns = namespace("team")
    denied = kubectl.apply(scenarios.big_a100_claim(ns, 9))
    assert denied.returncode != 0
    assert "quota/team-budgets" in denied.stderr
