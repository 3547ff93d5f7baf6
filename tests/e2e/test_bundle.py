"""The bundle as a user applies it (kustomize/overlays/local) on the real node: the certificate Job
injects the caBundle, three webhook replicas serve behind the Service, and the driver DaemonSet's pod
registers with the kubelet, publishes ResourceSlices through in-cluster config and prepares a claim.

Afterwards the session's host webhook and driver take over again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.helpers import Kubectl, wait_for
from webhook.dev import addons, scenarios
from webhook.dev.cluster import LocalCluster


@pytest.fixture
def bundle(cluster: LocalCluster, real_node: str) -> Iterator[dict[str, float]]:
    try:
        yield addons.apply_bundle(cluster)
    finally:
        addons.remove_bundle(cluster)


def test_bundle_runs_on_the_real_node(
    cluster: LocalCluster,
    kubectl: Kubectl,
    namespace: Callable[..., str],
    real_node: str,
    workload_image: str,
    bundle: dict[str, float],
) -> None:
    pods = kubectl.items("pods", "draguard-system")
    webhooks = [
        p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/name") == "draguard-webhook"
    ]
    assert len(webhooks) == 3 and all(p["spec"]["nodeName"] == real_node for p in webhooks)
    [driver] = [p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/name") == "draguard-driver"]
    # The bundle's webhook is called through its Service (caBundle from the Job), not by URL.
    cfg = kubectl.get("validatingwebhookconfiguration", "draguard")
    for hook in cfg["webhooks"]:
        assert hook["clientConfig"]["service"]["name"] == "draguard-webhook"
        assert "url" not in hook["clientConfig"]
    # The host driver's slices were deleted before the apply: these are the driver pod's, written
    # with its own service account through in-cluster config.
    slices = kubectl.items("resourceslices", None, "--field-selector", f"spec.nodeName={real_node}")
    assert slices and {s["spec"]["driver"] for s in slices} == {"gpu.nvidia.com"}

    # Admission through the in-cluster webhook: the tier policy still denies an A100 LLM Deployment.
    ns = namespace("bundle")
    kubectl.apply(scenarios.llm_template(ns, scenarios.A100))

    def denied() -> str | None:
        proc = kubectl.apply(scenarios.llm_deployment(ns, scenarios.A100), "--dry-run=server")
        return proc.stderr if proc.returncode != 0 and "denied" in proc.stderr else None

    assert "draguard" in wait_for(denied, "the in-cluster webhook to deny an A100 LLM Deployment", 60)

    # A claim pod is prepared by the DaemonSet's plugin and runs with its GPU.
    applied = kubectl.apply(scenarios.claim_pod(ns, "gpu", scenarios.A100, 1, workload_image, real_node))
    assert applied.returncode == 0, applied.stderr

    def running() -> bool:
        return bool(kubectl.get("pod", "gpu", ns)["status"].get("phase") == "Running")

    wait_for(running, "the claim pod Running with the DaemonSet's driver", 120)
    env = kubectl.ok("exec", "-n", ns, "gpu", "--", "printenv", "NVIDIA_VISIBLE_DEVICES")
    assert env.strip().startswith("GPU-")
    logs = kubectl.ok("logs", "-n", "draguard-system", driver["metadata"]["name"])
    assert "SIMULATED NVML" in logs.upper(), logs[-2000:]
    print(json.dumps(bundle))
