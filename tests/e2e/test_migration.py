"""Migration: the article's device-plugin pod, rewritten on admission and allocated by the real scheduler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.e2e.helpers import Kubectl, wait_for
from webhook.dev import scenarios


def test_legacy_pod_rewritten_claimed_and_allocated(kubectl: Kubectl, namespace: Callable[..., str]) -> None:
    ns = namespace("migrate", scenarios.MIGRATE_LABELS)
    pod_yaml = scenarios.legacy_pod(ns)

    def rewritten_in_dry_run() -> bool:
        # The webhook reads namespace labels from its watch cache, which learns of a new namespace a
        # moment after it is created; a server dry run shows when it applies migrate mode here.
        out = kubectl.run("apply", "--dry-run=server", "-o", "json", "-f", "-", input=pod_yaml)
        return out.returncode == 0 and '"resourceClaimTemplateName"' in out.stdout

    wait_for(rewritten_in_dry_run, "the webhook to see the new namespace's migrate label", timeout=20)
    applied = kubectl.apply(pod_yaml)
    assert applied.returncode == 0, applied.stderr

    pod = kubectl.get("pod", "gpu-training-legacy", ns)
    container = pod["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in (container.get("resources", {}).get("limits") or {})
    [claim_ref] = pod["spec"]["resourceClaims"]
    template = kubectl.get("resourceclaimtemplate", claim_ref["resourceClaimTemplateName"], ns)
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == scenarios.A100
    assert request["exactly"]["count"] == 2
    assert template["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "draguard"
    assert {"name": claim_ref["name"]} in container["resources"]["claims"]

    def bound() -> dict[str, Any] | None:
        p = kubectl.get("pod", "gpu-training-legacy", ns)
        return p if p["spec"].get("nodeName") and p["status"].get("resourceClaimStatuses") else None

    pod = wait_for(bound, "legacy pod scheduled with its generated claim")
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = kubectl.get("resourceclaim", claim_name, ns)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2
    assert {r["driver"] for r in results} == {scenarios.DRIVER}
    # Both GPUs come from the node the pod was bound to (the pool is named after the node).
    assert {r["pool"] for r in results} == {pod["spec"]["nodeName"]}
    slices = kubectl.items(
        "resourceslices", None, "--field-selector", f"spec.nodeName={pod['spec']['nodeName']}"
    )
    published = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
    for r in results:
        attrs = published[r["device"]]["attributes"]
        assert attrs["productName"]["string"].startswith("NVIDIA A100")
