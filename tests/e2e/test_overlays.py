"""Every kustomize overlay is accepted by a real API server (`kubectl apply --dry-run=server`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import Kubectl
from webhook.dev.cluster import FIELD_MANAGER, REPO_ROOT

OVERLAYS = sorted(p.parent for p in (REPO_ROOT / "kustomize" / "overlays").glob("*/kustomization.yaml"))


@pytest.mark.parametrize("overlay", OVERLAYS, ids=[p.name for p in OVERLAYS])
def test_overlay_server_dry_run(kubectl: Kubectl, overlay: Path) -> None:
    rendered = kubectl.ok("kustomize", str(overlay))
    assert "kind: ValidatingWebhookConfiguration" in rendered
    # Namespaced objects need their namespace to exist even for a dry run.
    for ns in ("draguard-system", "draguard-driver"):
        kubectl.apply(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n")
    # Server-side apply under the harness's field manager: the overlay's Service-based clientConfig
    # replaces the local URL one instead of being merged into it (which would set both).
    proc = kubectl.run(
        "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
        "--dry-run=server", "-f", "-", input=rendered,
    )  # fmt: skip
    assert proc.returncode == 0, f"{overlay.name}: {proc.stderr}"
    assert "serverside-applied (server dry run)" in proc.stdout
