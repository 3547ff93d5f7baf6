"""The release workflow's build steps run here (scripts/release/build.py, without the image), and the
workflow's jobs hand one version and one image digest from step to step (checked by actionlint too)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.version import Version
from release_scripts import ROOT, SCRIPTS, load

from tests.gotool import go_tool

dist = load("dist")
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    go_tool("ocibundle")  # built (or skipped without Go) before the script needs it
    out = tmp_path_factory.mktemp("release") / "dist"
    before = (ROOT / "pyproject.toml").read_bytes()
    res = subprocess.run(
        [sys.executable, str(SCRIPTS / "build.py"), "--no-image", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    # The version is stamped into a copy; the checkout is never changed.
    assert (ROOT / "pyproject.toml").read_bytes() == before
    return out, json.loads(res.stdout)


@pytest.mark.slow
def test_local_build_makes_wheel_sdist_and_bundle_of_the_derived_version(
    built: tuple[Path, dict[str, Any]],
) -> None:
    out, summary = built
    # The version of the commit the build ran on (the checkout may have moved on since).
    py, oci, commit = summary["version"], summary["oci_tag"], summary["commit"]
    Version(py)  # PEP 440
    assert summary["release"] or (f"g{commit[:12]}" in py and f"g{commit[:12]}" in oci)
    assert "+" not in oci and oci.split("-")[0] == Version(py).base_version
    names = sorted(p.name for p in out.iterdir())
    assert f"draguard-{py}.tar.gz" in names and f"draguard-{py}-py3-none-any.whl" in names
    assert f"draguard-bundle-{oci}.oci.tar" in names and f"draguard-bundle-{oci}.tar.gz" in names
    with zipfile.ZipFile(out / f"draguard-{py}-py3-none-any.whl") as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        assert f"\nVersion: {py}\n" in zf.read(meta).decode()
        entry = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        assert "draguard = " in zf.read(entry).decode()
    # Both manifests were read back by their engine's rules, with every file of the tree.
    checked = {c["name"]: c for c in summary["bundle"]["checked"]}
    assert set(checked) == {"flux", "argocd"} and checked["flux"]["files"] == checked["argocd"]["files"] > 10
    assert {c["digest"] for c in checked.values()} == set(summary["bundle"]["manifests"].values())


@pytest.mark.slow
def test_sha256sums_lists_every_file_with_its_digest(built: tuple[Path, dict[str, Any]]) -> None:
    out, _ = built
    lines = (out / "SHA256SUMS").read_text().splitlines()
    listed: dict[str, str] = {}
    for line in lines:
        digest, name = line.split("  ", 1)
        listed[name] = digest
    files = {p.name for p in out.iterdir() if p.is_file() and p.name != "SHA256SUMS"}
    assert set(listed) == files
    for name, digest in listed.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.slow
def test_wheel_ships_the_default_policies(
    built: tuple[Path, dict[str, Any]],
) -> None:
    out, summary = built
    wheel = out / f"draguard-{summary['version']}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        shipped = {
            n.rsplit("/", 1)[1]: zf.read(n)
            for n in zf.namelist()
            if "/policies/" in f"/{n}" and n.endswith(".yaml")
        }
    assert shipped, "the wheel must carry the default policies (setup.py's package data)"
    for policy in sorted((ROOT / "policies").glob("*.yaml")):
        assert shipped.get(policy.name) == policy.read_bytes(), (
            f"{policy.name} missing or different in the wheel"
        )


@pytest.mark.slow
def test_a_distribution_that_does_not_carry_the_version_is_refused(
    built: tuple[Path, dict[str, Any]],
) -> None:
    out, summary = built
    v = summary["version"]
    with pytest.raises(dist.DistError, match=r"METADATA says version .* expected '9\.9\.9'"):
        dist.verify(out / f"draguard-{v}.tar.gz", out / f"draguard-{v}-py3-none-any.whl", "9.9.9")


def _jobs() -> dict[str, Any]:
    return dict(yaml.safe_load(WORKFLOW.read_text())["jobs"])


def test_one_version_and_one_image_digest_flow_through_the_jobs() -> None:
    jobs = _jobs()
    assert {"version", "python", "image", "bundle", "publish"} <= set(jobs)
    checkout = jobs["version"]["steps"][0]
    assert checkout["uses"].startswith("actions/checkout@") and checkout["with"]["fetch-depth"] == 0
    assert "--require-release" in jobs["version"]["steps"][1]["run"]
    # The image's wheel is stamped before BuildKit builds it.
    steps = jobs["image"]["steps"]
    stamp = next(i for i, s in enumerate(steps) if "version.py --stamp" in str(s.get("run", "")))
    build = next(
        i for i, s in enumerate(steps) if str(s.get("uses", "")).startswith("docker/build-push-action@")
    )
    assert stamp < build
    # The bundle pins the digest the image job pushed.
    bundle_steps = jobs["bundle"]["steps"]
    make = next(s for s in bundle_steps if "bundle.py" in str(s.get("run", "")))
    assert (
        make["env"]["DIGEST"] == "${{ needs.image.outputs.digest }}"
        and '"${IMAGE,,}@${DIGEST}"' in make["run"]
    )
    assert jobs["image"]["outputs"]["digest"] == "${{ steps.build.outputs.digest }}"
    # Only a release tag publishes, after everything it lists exists.
    assert jobs["publish"]["if"] == "needs.version.outputs.release == 'true'"
    assert set(jobs["publish"]["needs"]) == {"version", "python", "image", "bundle"}


def test_every_job_that_attests_or_signs_may_do_so_and_no_more() -> None:
    for name, job in _jobs().items():
        uses = " ".join(str(s.get("uses", "")) + str(s.get("run", "")) for s in job["steps"])
        perms = job.get("permissions", {})
        if "attest-build-provenance" in uses or "cosign sign" in uses:
            assert perms.get("id-token") == "write", name
        if "attest-build-provenance" in uses:
            assert perms.get("attestations") == "write", name
        if "id-token" in perms:
            assert "attest" in uses or "cosign" in uses, f"{name} asks for an OIDC token it does not use"
    assert _jobs()["publish"]["permissions"] == {"contents": "write"}


def test_actionlint_catches_a_wrong_output_between_the_new_jobs(tmp_path: Path) -> None:
    bad = tmp_path / "release.yml"
    text = WORKFLOW.read_text()
    assert "needs.image.outputs.digest" in text
    bad.write_text(text.replace("needs.image.outputs.digest", "needs.image.outputs.digets"))
    res = subprocess.run(
        [str(go_tool("actionlint")), "-shellcheck=", "-pyflakes=", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 1 and "digets" in res.stdout, res.stdout
