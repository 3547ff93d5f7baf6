"""The webhook is out of the scheduler's path: with every webhook instance down, claims are still
allocated, reserved, released, deallocated and deleted.

Claim UPDATEs (finalizers, reservedFor) and status writes come from the scheduler, the resourceclaim
controller and kubelet; the bundle intercepts only claim CREATEs, so none of them waits on draguard.
The claim and its pod are created while the webhook serves; the pod is held unschedulable by a node
label no node carries, the webhook is stopped, and only then is the label put on a node.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import Kubectl, wait_for
from webhook.dev import scenarios
from webhook.dev.cluster import LocalCluster

A100 = "gpu.nvidia.com-a100"


def _claim_and_pod(ns: str, gate: str) -> str:
    return f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: sched-claim
  namespace: {ns}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {A100}
        count: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: sched-pod
  namespace: {ns}
spec:
  restartPolicy: Never
  nodeSelector:
    draguard.io/e2e-gate: "{gate}"
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimName: sched-claim
"""


@pytest.fixture
def gate(kubectl: Kubectl) -> Iterator[str]:
    value = uuid.uuid4().hex[:8]
    yield value
    kubectl.run("label", "node", "gpu-a100-0", "draguard.io/e2e-gate-")


def test_claims_live_and_die_with_the_webhook_down(
    cluster: LocalCluster, kubectl: Kubectl, namespace: Callable[..., str], gate: str
) -> None:
    if "webhook" not in (cluster.state.get("pids") or {}):
        pytest.skip("the webhook is not part of this cluster (webhook/server missing)")
    ns = namespace("sched")
    created = kubectl.apply(_claim_and_pod(ns, gate))
    assert created.returncode == 0, created.stderr
    pod = kubectl.get("pod", "sched-pod", ns)
    assert not pod["spec"].get("nodeName"), "the pod must wait for the gate label"

    assert cluster.stop("webhook")
    try:
        # Really down and failing closed: a new GPU pod is refused.
        refused = kubectl.apply(scenarios.plain_gpu_pod(ns, "refused"))
        assert refused.returncode != 0 and "failed calling webhook" in refused.stderr, refused.stderr

        # Node UPDATE (not intercepted) lets the scheduler place the pod: it allocates the claim,
        # reserves it for the pod (status), and the claim carries the delete-protection finalizer.
        kubectl.ok("label", "node", "gpu-a100-0", f"draguard.io/e2e-gate={gate}", "--overwrite")

        def reserved() -> dict[str, Any] | None:
            claim = kubectl.get("resourceclaim", "sched-claim", ns)
            status = claim.get("status") or {}
            return claim if status.get("allocation") and status.get("reservedFor") else None

        claim = wait_for(reserved, "claim allocated and reserved with the webhook down", timeout=90)
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["sched-pod"]
        assert claim["metadata"].get("finalizers"), "the claim should be protected while in use"
        assert (
            wait_for(
                lambda: kubectl.get("pod", "sched-pod", ns)["spec"].get("nodeName"), "pod bound", timeout=60
            )
            == "gpu-a100-0"
        )

        # The pod goes away: the controller drops the reservation and deallocates (status writes).
        kubectl.ok("delete", "pod", "sched-pod", "-n", ns, "--force", "--grace-period=0")

        def released() -> bool:
            status = kubectl.get("resourceclaim", "sched-claim", ns).get("status") or {}
            return not status.get("reservedFor") and not status.get("allocation")

        wait_for(released, "claim released and deallocated with the webhook down", timeout=90)

        # Deleting the claim: its finalizer is removed by an UPDATE the webhook never sees.
        kubectl.ok("delete", "resourceclaim", "sched-claim", "-n", ns, "--wait=false")
        wait_for(
            lambda: kubectl.run("get", "resourceclaim", "sched-claim", "-n", ns).returncode != 0,
            "claim deleted with the webhook down",
            timeout=60,
        )
    finally:
        cluster.start_webhook(Path(cluster.state["policies"]))
