"""The node's binaries from scripts/build-node.sh: present, the pinned versions, runc with seccomp."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from webhook.dev import image

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-node.sh"


def _versions() -> dict[str, str]:
    text = (ROOT / "scripts/node-build/versions").read_text()
    return dict(re.findall(r"^([A-Z_]+)=(\S+)$", text, re.M))


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    try:
        return image.find_node_bin_dir()
    except image.ImageError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


def _out(*cmd: str, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL
    )
    assert res.returncode == 0, f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr}"
    return res.stdout


def test_build_node_is_a_no_op_when_everything_is_built(bin_dir: Path) -> None:
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "up to date: kubelet kube-proxy containerd runc cni crictl" in res.stdout
    assert "building" not in res.stdout
    assert Path(_out("bash", str(SCRIPT), "--print-dir").strip()) == bin_dir.parent


def test_binaries_report_the_pinned_versions(bin_dir: Path) -> None:
    v = _versions()
    kube = re.search(r"k8s\.io/kubernetes (v\S+)", (ROOT / "scripts/k8s-build/go.mod").read_text())
    assert kube is not None
    assert _out(str(bin_dir / "kubelet"), "--version").strip() == f"Kubernetes {kube.group(1)}"
    assert _out(str(bin_dir / "kube-proxy"), "--version").strip() == f"Kubernetes {kube.group(1)}"
    assert f" {v['CONTAINERD_VERSION']}" in _out(str(bin_dir / "containerd"), "--version")
    assert f" {v['CONTAINERD_VERSION']}" in _out(str(bin_dir / "ctr"), "--version")
    assert f"Version:  {v['CONTAINERD_VERSION']}" in _out(str(bin_dir / "containerd-shim-runc-v2"), "-v")
    assert _out(str(bin_dir / "crictl"), "--version").strip() == f"crictl version {v['CRICTL_VERSION']}"
    runc = _out(str(bin_dir / "runc"), "--version")
    assert runc.startswith(f"runc version {v['RUNC_VERSION'].removeprefix('v')}\n")
    cni = bin_dir.parent / "cni"
    for plugin in image.CNI_PLUGINS:
        about_text = subprocess.run(
            [str(cni / plugin)], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
        assert f"CNI {plugin} plugin {v['CNI_PLUGINS_VERSION']}\n" in about_text.stdout + about_text.stderr
        about = json.loads(_out(str(cni / plugin), env={"CNI_COMMAND": "VERSION"}))
        assert "1.0.0" in about["supportedVersions"], plugin


def test_runc_has_seccomp(bin_dir: Path) -> None:
    """A runc without seccomp refuses the bundle's `seccompProfile: RuntimeDefault` pods."""
    assert "libseccomp: " in _out(str(bin_dir / "runc"), "--version")
    features = json.loads(_out(str(bin_dir / "runc"), "features"))
    assert features["linux"]["seccomp"]["enabled"] is True
    assert "SCMP_ACT_ERRNO" in features["linux"]["seccomp"]["actions"]
