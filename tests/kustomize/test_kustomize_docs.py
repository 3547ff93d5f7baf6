"""docs/install.md stays true to the bundle: its commands name real overlays and objects, and the
uninstall order removes the webhook configurations before anything they call."""

from __future__ import annotations

import re
from pathlib import Path

from kbundle import KUSTOMIZE, OVERLAYS, REPO, build, run_build

DOC = (REPO / "docs" / "install.md").read_text()


def test_one_install_command_per_overlay() -> None:
    found = re.findall(r"^kubectl apply -k kustomize/overlays/(\w+)", DOC, flags=re.M)
    assert found == list(OVERLAYS)
    for path in set(re.findall(r"kustomize/(?:overlays|components)/[\w-]+", DOC)):
        assert (REPO / path).is_dir(), path


def test_uninstall_deletes_webhook_configurations_first() -> None:
    section = DOC[DOC.index("## Uninstall") :]
    commands = [line for line in section.splitlines() if line.startswith("kubectl ")]
    assert commands[0].startswith("kubectl delete validatingwebhookconfiguration draguard")
    assert commands[1].startswith("kubectl delete mutatingwebhookconfiguration draguard")
    driver = next(i for i, c in enumerate(commands) if "daemonset draguard-driver" in c)
    webhook = next(i for i, c in enumerate(commands) if "deployment" in c and "draguard-webhook" in c)
    assert 1 < webhook < driver
    assert commands[-1].startswith("kubectl delete -k kustomize/overlays/")


def test_named_objects_exist_in_the_build() -> None:
    names = {o["metadata"]["name"] for o in build("eks")}
    for name in ("draguard-certs", "draguard-certs-renew", "draguard-webhook", "draguard-driver", "draguard"):
        assert name in names
        assert name in DOC
    assert "python kustomize/sync-policies.py" in DOC and (KUSTOMIZE / "sync-policies.py").is_file()


def test_the_by_digest_overlay_runs_every_draguard_container_from_that_digest(tmp_path: Path) -> None:
    """The docs' snippet, built next to a copy of kustomize/: no draguard container keeps a tag."""
    block = next(
        b
        for b in re.findall(r"```yaml\n(.*?)```", DOC, flags=re.S)
        if b.startswith("# my-cluster/") and "digest:" in b
    )
    digest = re.search(r"digest: (sha256:[0-9a-f]{64})", block)
    assert digest is not None, block
    (tmp_path / "kustomize").symlink_to(KUSTOMIZE, target_is_directory=True)
    (tmp_path / "my-cluster").mkdir()
    (tmp_path / "my-cluster/kustomization.yaml").write_text(block)
    images = []
    for obj in run_build(tmp_path / "my-cluster"):
        spec = obj.get("spec", {})
        pod = spec.get("jobTemplate", {}).get("spec", spec).get("template", {}).get("spec", {})
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            if c["image"].startswith("ghcr.io/draguard/draguard"):
                images.append((obj["kind"], c["image"]))
    kinds = {k for k, _ in images}
    assert {"Deployment", "DaemonSet", "Job", "CronJob"} <= kinds, images
    assert {img for _, img in images} == {f"ghcr.io/draguard/draguard@{digest.group(1)}"}, images
