"""The article's failure case 2 on the real node: the kubelet and the driver die while a claim is being
prepared, the pod is deleted meanwhile, both come back. No device stays prepared for the deleted pod,
and a new pod gets all of the node's GPUs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.e2e.helpers import Kubectl, cdi_specs_for, start_claim_pod, wait_for
from webhook.dev import scenarios
from webhook.dev.cluster import LocalCluster


def _checkpointed(cluster: LocalCluster, uid: str) -> bool:
    """Whether the driver's checkpoint lists the claim as prepared (or half-prepared)."""
    path = cluster.real_node_driver_dirs().plugins / "checkpoint.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return False
    return uid in (doc.get("v2") or {}).get("preparedClaims", {})


def test_kubelet_and_driver_killed_during_prepare_leave_nothing_prepared(
    cluster: LocalCluster,
    kubectl: Kubectl,
    namespace: Callable[..., str],
    real_node: str,
    workload_image: str,
) -> None:
    ns = namespace("crash")
    driver = f"driver-{real_node}"
    # All four of the node's GPUs: the next pod can only run if none stays held.
    applied = kubectl.apply(scenarios.claim_pod(ns, "victim", scenarios.A100, 4, workload_image, real_node))
    assert applied.returncode == 0, applied.stderr

    def reserved() -> dict[str, Any] | None:
        c = kubectl.get("resourceclaim", "victim-gpu", ns)
        return c if c.get("status", {}).get("reservedFor") else None

    # Allocated and reserved for the pod: the kubelet is now preparing it (or about to).
    uid = wait_for(reserved, "the victim's claim allocated and reserved")["metadata"]["uid"]
    assert cluster.kill("kubelet") and cluster.kill(driver)
    kubectl.ok("delete", "pod", "-n", ns, "victim", "--force", "--grace-period=0")
    kubectl.ok("delete", "resourceclaim", "-n", ns, "victim-gpu", "--wait=true", "--timeout=60s")

    cluster.start_real_node_driver()
    cluster.restart_kubelet()

    def released() -> bool:
        return not cdi_specs_for(cluster, uid) and not _checkpointed(cluster, uid)

    wait_for(
        released, "the deleted pod's claim unprepared after the restart (no CDI spec, no checkpoint)", 90
    )

    # All four GPUs: it runs only once none stays held for the deleted pod.
    start_claim_pod(kubectl, ns, "next", scenarios.A100, 4, workload_image, real_node, timeout=120)
    seen = kubectl.ok("logs", "-n", ns, "next")
    (line,) = [ln for ln in seen.splitlines() if ln.startswith("device nodes: ")]
    nodes = set(line.removeprefix("device nodes: ").split())
    # All four GPUs and the control nodes the CDI spec lists (only those that exist on the node).
    gpus = {n for n in nodes if n[len("nvidia") :].isdigit()}
    assert gpus == {"nvidia0", "nvidia1", "nvidia2", "nvidia3"}, seen
    assert {"nvidiactl", "nvidia-uvm"} <= nodes, seen
