"""`draguard preflight` and webhook.dra.coexist: NVIDIA's device plugin or DRA driver next to
draguard's driver is refused (exit 1) or warned about, with what to do; draguard's own bundle and a
clean cluster pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from driver import coexist as driver_coexist
from webhook.dra.coexist import MANAGED_BY, preflight

ROOT = Path(__file__).resolve().parents[2]


def node(name: str, gpus: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    status = {"capacity": {"cpu": "96", "nvidia.com/gpu": gpus}} if gpus else {"capacity": {"cpu": "96"}}
    meta = {"name": name, "labels": labels or {}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "status": status}


def daemonset(ns: str, name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": ns},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}},
    }  # fmt: skip


def resource_slice(name: str, node_name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node_name, "pool": {"name": node_name}},
    }  # fmt: skip


def device_class(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}}


def as_list(*items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


def rules(objs: list[Any]) -> list[tuple[str, str, str]]:
    return sorted((f.severity.value, f.rule, str(f.object)) for f in preflight(objs))


def test_device_plugin_serving_gpus_is_an_error_and_its_daemonset_a_warning() -> None:
    found = rules([as_list(
        node("gpu-1", gpus="8"), node("cpu-1"),
        daemonset("kube-system", "nvidia-device-plugin-daemonset",
                  "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"),
    )])  # fmt: skip
    assert found == [
        ("error", "coexist/device-plugin", "Node/gpu-1"),
        ("warning", "coexist/device-plugin", "DaemonSet/kube-system/nvidia-device-plugin-daemonset"),
    ]
    (err,) = [f for f in preflight([node("gpu-1", gpus="8")])]
    assert "nvidia.com/gpu=8" in err.message and "devicePlugin.enabled=false" in err.fix


def test_nvidias_dra_driver_slices_are_errors_and_draguards_own_are_not() -> None:
    ours = resource_slice("gpu-2-gpu.nvidia.com-abc", "gpu-2", {MANAGED_BY[0]: MANAGED_BY[1]})
    theirs = resource_slice("gpu-3-gpu.nvidia.com-xyz", "gpu-3")
    found = rules([
        ours, theirs,
        daemonset("nvidia-dra-driver-gpu", "nvidia-dra-driver-gpu-kubelet-plugin",
                  "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.3.0@sha256:" + "0" * 64),
        device_class("gpu.nvidia.com"),
        device_class("gpu.nvidia.com-h100"),
    ])  # fmt: skip
    assert found == [
        ("error", "coexist/nvidia-dra-driver", "ResourceSlice/gpu-3-gpu.nvidia.com-xyz"),
        ("warning", "coexist/nvidia-dra-driver",
         "DaemonSet/nvidia-dra-driver-gpu/nvidia-dra-driver-gpu-kubelet-plugin"),
        ("warning", "coexist/nvidia-dra-driver", "DeviceClass/gpu.nvidia.com"),
    ]
    # The label is the one draguard's driver writes on its slices and looks for at start.
    assert driver_coexist.MANAGED_BY == MANAGED_BY


def test_gke_gpu_pool_without_the_no_device_plugin_label_is_warned_about() -> None:
    accel = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    found = rules([
        node("gke-a", labels=accel),
        node("gke-b", labels={**accel, "gke-no-default-nvidia-gpu-device-plugin": "true"}),
    ])  # fmt: skip
    assert found == [("warning", "coexist/gke-node-pool", "Node/gke-a")]


def test_the_bundle_itself_and_a_clean_cluster_pass() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "kustomize" / "overlays" / "gke")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    bundle = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert any(d["kind"] == "DaemonSet" for d in bundle) and any(d["kind"] == "DeviceClass" for d in bundle)
    assert preflight([*bundle, node("cpu-1"), "not an object", {"kind": "List", "items": [None]}]) == []


def _cli(tmp_path: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", "preflight", *args],
        input=stdin, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


def test_cli_exit_status_and_messages(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text(yaml.safe_dump(as_list(node("gpu-1", gpus="4"), resource_slice("s", "gpu-1"))))
    res = _cli(tmp_path, str(bad))
    assert res.returncode == 1, res.stderr
    assert "error: coexist/device-plugin Node/gpu-1" in res.stdout and "fix: " in res.stdout
    assert "2 conflict(s), 0 warning(s)" in res.stdout
    as_json = json.loads(_cli(tmp_path, "--format", "json", str(bad)).stdout)
    assert as_json["conflicts"] == 2 and {f["rule"] for f in as_json["findings"]} == {
        "coexist/device-plugin", "coexist/nvidia-dra-driver",
    }  # fmt: skip
    # Warnings only: exit 0.
    warn = _cli(tmp_path, "-", stdin=json.dumps(daemonset("gpu", "dp", "nvidia/k8s-device-plugin:v0.14")))
    assert warn.returncode == 0 and "warning: coexist/device-plugin" in warn.stdout
    clean = _cli(tmp_path, "-", stdin=yaml.safe_dump(node("cpu-1")))
    assert clean.returncode == 0 and "no NVIDIA device plugin or DRA driver found" in clean.stdout
    # Unreadable input: exit 2, one line naming the file and line, no traceback.
    broken = tmp_path / "broken.yaml"
    broken.write_text("items:\n  - {kind: Node\n")
    res = _cli(tmp_path, str(broken))
    assert res.returncode == 2 and f"{broken}:" in res.stderr and "kubectl get nodes" in res.stderr
    assert "Traceback" not in res.stderr
    missing = _cli(tmp_path, str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
