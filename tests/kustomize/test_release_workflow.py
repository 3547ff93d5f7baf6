"""The release workflow: actionlint (the Go module, tools/actionlint) finds nothing, and the workflow
builds both architectures from the Containerfile, attaches an SBOM and signs the pushed digest."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from kbundle import REPO

from tests.gotool import go_tool

WORKFLOWS = REPO / ".github" / "workflows"


def _lint(*paths: Path) -> subprocess.CompletedProcess[str]:
    # shellcheck/pyflakes integration off: they are separate programs this machine need not have.
    return subprocess.run(
        [str(go_tool("actionlint")), "-shellcheck=", "-pyflakes=", *map(str, paths)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_actionlint_passes_every_workflow() -> None:
    files = sorted(WORKFLOWS.glob("*.y*ml"))
    assert files
    res = _lint(*files)
    assert res.returncode == 0, res.stdout + res.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text(
        (WORKFLOWS / "release.yml")
        .read_text()
        .replace("steps.build.outputs.digest", "steps.bild.outputs.digest")
    )
    res = _lint(bad)
    assert res.returncode == 1 and "bild" in res.stdout, res.stdout


def _steps() -> list[dict[str, Any]]:
    doc = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    return list(doc["jobs"]["image"]["steps"])


def test_release_builds_both_architectures_with_sbom_and_signs_the_digest() -> None:
    steps = _steps()
    build = next(s for s in steps if str(s.get("uses", "")).startswith("docker/build-push-action@"))
    assert build["with"]["file"] == "Containerfile" and (REPO / "Containerfile").is_file()
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["sbom"] is True and build["with"]["push"] is True
    sign = next(s for s in steps if "cosign sign" in str(s.get("run", "")))
    assert "${IMAGE,,}@${DIGEST}" in sign["run"], "sign the pushed digest (lowercase path), never a tag"
    assert sign["env"]["DIGEST"] == "${{ steps.build.outputs.digest }}"
    perms = yaml.safe_load((WORKFLOWS / "release.yml").read_text())["jobs"]["image"]["permissions"]
    assert perms["id-token"] == "write" and perms["packages"] == "write"


def test_every_action_is_pinned_by_full_commit_digest() -> None:
    """A tag can be moved to other code; a commit digest cannot. The version stays as a comment."""
    pinned = re.compile(r"^\s*(?:-\s+)?uses:\s+[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+)*$")
    for wf in sorted(WORKFLOWS.glob("*.y*ml")):
        uses = [line for line in wf.read_text().splitlines() if re.match(r"^\s*(-\s+)?uses:", line)]
        assert uses, wf
        for line in uses:
            local = line.split("uses:", 1)[1].strip().startswith("./")
            assert local or pinned.match(line), f"{wf.name}: {line.strip()}"


def test_every_image_the_workflow_runs_is_pinned_by_digest() -> None:
    """The emulator, BuildKit and the Containerfile's base: a moved tag would change what is released."""
    pinned = re.compile(r"^[\w.-]+(?::\d+)?/[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}$")
    steps = _steps()
    qemu = next(s for s in steps if str(s.get("uses", "")).startswith("docker/setup-qemu-action@"))
    assert pinned.match(qemu["with"]["image"]), qemu["with"]
    buildx = next(s for s in steps if str(s.get("uses", "")).startswith("docker/setup-buildx-action@"))
    opts = dict(o.split("=", 1) for o in buildx["with"]["driver-opts"].split(","))
    assert pinned.match(opts["image"]), opts
    # Anything else the workflow names as an image is either pinned or the pushed digest itself.
    named = re.compile(r"(?<![\w-])(?:image[:=][ \t]*|docker://)(\S[^\n#]*?)[ \t]*$", re.M)
    for wf in sorted(WORKFLOWS.glob("*.y*ml")):
        for m in named.finditer(wf.read_text()):
            ref = m.group(1)
            built = "${{ steps.img.outputs.name }}@${{ steps.build.outputs.digest }}"
            assert pinned.match(ref) or ref == built, f"{wf.name}: {ref}"
    build = next(s for s in steps if str(s.get("uses", "")).startswith("docker/build-push-action@"))
    assert "build-args" not in build["with"], "the base comes from the Containerfile's pinned ARG default"
