"""Quota: the webhook denies a claim over the team budget; the rendered ResourceQuota does without it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.helpers import Kubectl
from webhook.dev import scenarios
from webhook.dev.cluster import REPO_ROOT, LocalCluster


@pytest.fixture
def webhook_bypassed(cluster: LocalCluster, kubectl: Kubectl) -> Iterator[None]:
    """Remove draguard's webhook configurations for the test, then register them again."""
    port = (cluster.state.get("ports") or {}).get("webhook")
    kubectl.ok("delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", "draguard",
               "--ignore-not-found")  # fmt: skip
    try:
        yield
    finally:
        if port:
            cluster.register_webhook(int(port))


def test_quota_denied_by_webhook(
    cluster: LocalCluster, kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    if "webhook" not in (cluster.state.get("pids") or {}):
        pytest.skip("the webhook is not part of this cluster (webhook/server missing)")
    ns = namespace("team")
    denied = kubectl.apply(scenarios.big_a100_claim(ns, 9))
    assert denied.returncode != 0
    assert "quota/team-budgets" in denied.stderr
    assert scenarios.A100 in denied.stderr
    assert kubectl.run("get", "resourceclaim", "too-many-a100", "-n", ns).returncode != 0


def test_rendered_resourcequota_blocks_without_webhook(
    kubectl: Kubectl, namespace: Callable[..., str], webhook_bypassed: None
) -> None:
    ns = namespace("team")
    rendered = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "quota",
            "render",
            "--policies",
            str(REPO_ROOT / "policies"),
            "--namespace",
            ns,
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    ).stdout
    applied = kubectl.apply(rendered)
    assert applied.returncode == 0, applied.stderr

    over = kubectl.apply(scenarios.big_a100_claim(ns, 9))
    assert over.returncode != 0
    assert "exceeded quota" in over.stderr
    assert f"{scenarios.A100}.deviceclass.resource.k8s.io/devices" in over.stderr
    within = kubectl.apply(scenarios.big_a100_claim(ns, 8))
    assert within.returncode == 0, within.stderr
