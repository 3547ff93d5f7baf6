"""The article's DeviceClass CEL mistake (`migProfile`) meets the linter in the real admission path."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import Kubectl
from webhook.dev import scenarios
from webhook.dev.cluster import REPO_ROOT, LocalCluster


def _require_webhook(cluster: LocalCluster) -> None:
    if "webhook" not in (cluster.state.get("pids") or {}):
        pytest.skip("the webhook is not part of this cluster (webhook/server missing)")


@pytest.fixture
def strict_cel(cluster: LocalCluster, tmp_path: Path) -> Iterator[None]:
    """Run the webhook with the shipped policies, but unknown CEL attributes enforced (denied)."""
    _require_webhook(cluster)
    policies = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", policies, ignore=shutil.ignore_patterns("tests"))
    lint = policies / "cel-lint.yaml"
    text = lint.read_text()
    assert "cel/unknown-attribute: {mode: warn}" in text, "cel-lint.yaml changed; update this test"
    lint.write_text(
        text.replace("cel/unknown-attribute: {mode: warn}", "cel/unknown-attribute: {mode: enforce}")
    )
    shipped = Path(cluster.state["policies"])
    cluster.stop("webhook")
    cluster.start_webhook(policies)
    try:
        yield
    finally:
        cluster.stop("webhook")
        cluster.start_webhook(shipped)


def test_shipped_policy_warns(cluster: LocalCluster, kubectl: Kubectl) -> None:
    _require_webhook(cluster)
    proc = kubectl.run("apply", "--dry-run=server", "-f", "-", input=scenarios.mig_profile_deviceclass())
    assert proc.returncode == 0, proc.stderr
    assert "Warning: draguard [cel/unknown-attribute]" in proc.stderr
    assert "migProf" in proc.stderr


def test_enforced_lint_denies_with_suggestion(kubectl: Kubectl, strict_cel: None) -> None:
    proc = kubectl.apply(scenarios.mig_profile_deviceclass())
    assert proc.returncode != 0
    assert 'admission webhook "deviceclasses.validate.draguard.io" denied the request' in proc.stderr
    assert "[cel/unknown-attribute]" in proc.stderr
    assert "migProfile" in proc.stderr
    # The suggestion names the attribute the driver really publishes, with the corrected expression.
    assert "did you mean 'profile'" in proc.stderr
    assert "Fix:" in proc.stderr
    assert "device.attributes['gpu.nvidia.com'].profile == '3g.20gb'" in proc.stderr
    assert kubectl.run("get", "deviceclass", "gpu.nvidia.com-a100-mig-3g20gb-typo").returncode != 0
