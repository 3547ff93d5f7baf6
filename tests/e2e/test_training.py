"""The article's 4-GPU training claim: matchAttribute on nvlinkDomain gives four GPUs of one domain."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.e2e.helpers import Kubectl, wait_for
from webhook.dev import scenarios


def test_four_a100_share_nvlink_domain(kubectl: Kubectl, namespace: Callable[..., str]) -> None:
    ns = namespace("training")
    applied = kubectl.apply(scenarios.training_claim(ns))
    assert applied.returncode == 0, applied.stderr

    def allocated() -> dict[str, Any] | None:
        claim = kubectl.get("resourceclaim", "training-gpu-claim", ns)
        return claim if (claim.get("status") or {}).get("allocation") else None

    claim = wait_for(allocated, "training claim allocated", timeout=90)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 4
    [pool] = {r["pool"] for r in results}
    slices = kubectl.items("resourceslices", None, "--field-selector", f"spec.nodeName={pool}")
    published = {d["name"]: d["attributes"] for s in slices for d in s["spec"]["devices"]}
    domains = {published[r["device"]]["nvlinkDomain"]["string"] for r in results}
    assert len(domains) == 1, f"GPUs span NVLink domains {domains}"
    assert all(published[r["device"]]["productName"]["string"].startswith("NVIDIA A100") for r in results)
    pod = kubectl.get("pod", "distributed-training", ns)
    assert pod["spec"]["nodeName"] == pool
