"""`draguard driver inventory` / `run` as a user runs them (separate process, real output)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {
        k: v for k, v in os.environ.items() if k not in ("DRAGUARD_NVML_SIM", "KUBECONFIG", "NODE_NAME")
    }
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "driver.cli", "driver", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_inventory_json_from_simulated_topology():
    p = run("inventory", "--sim", "mixed-nvlink-pairs", "--node-name", "gpu-node-7", "-o", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    (s,) = doc["items"]
    assert s["spec"]["pool"]["name"] == "gpu-node-7" and s["spec"]["nodeName"] == "gpu-node-7"
    assert [d["name"] for d in s["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert s["metadata"]["annotations"]["draguard.io/simulated-nvml"].endswith("mixed-nvlink-pairs.yaml")
    assert "SIMULATED NVML" in p.stderr  # loud, on stderr, so the output stays clean


def test_inventory_yaml_via_env_and_v1beta1():
    p = run(
        "inventory", "--node-name", "n", "--api-version", "v1beta1", env={"DRAGUARD_NVML_SIM": "a100-4x-mig"}
    )
    assert p.returncode == 0, p.stderr
    doc = yaml.safe_load(p.stdout)
    devs = doc["items"][0]["spec"]["devices"]
    assert len(devs) == 8 and devs[0]["basic"]["attributes"]["profile"] == {"string": "3g.20gb"}


def test_real_without_nvml_is_a_clear_error():
    p = run("inventory", "--real", env={"DRAGUARD_NVML_SIM": "a100-4x-mig"})
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    assert "NVML is not usable on this machine" in p.stderr and "--sim" in p.stderr


def test_missing_topology_lists_shipped_ones():
    p = run("inventory", "--sim", "no-such-topology")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "h100-8x-nvlink" in p.stderr and "a100-4x-nvlink" in p.stderr


def test_sim_and_real_are_exclusive():
    p = run("inventory", "--sim", "a100-4x-mig", "--real")
    assert p.returncode == 2 and "not allowed with" in p.stderr


def test_run_without_api_access_says_what_to_do():
    p = run("run", "--sim", "h100-8x-nvlink", "--node-name", "n1")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "--kubeconfig" in p.stderr


def test_run_requires_node_name():
    p = run("run", "--sim", "h100-8x-nvlink", "--kubeconfig", "/nonexistent")
    assert p.returncode == 1 and "--node-name" in p.stderr


def test_run_with_unreadable_kubeconfig():
    p = run("run", "--sim", "h100-8x-nvlink", "--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "Kubernetes configuration" in p.stderr


def test_run_with_a_socket_path_over_the_unix_limit_names_the_path_the_limit_and_the_fix(tmp_path: Path):
    """A plugin directory deep enough that `dra-<podUID>.sock` exceeds sun_path: refused at start."""
    plugins = tmp_path / ("p" * 60) / "gpu.nvidia.com"
    pod_uid = "0f6c1d2e-8a3b-4c5d-9e7f-112233445566"
    sock = plugins / f"dra-{pod_uid}.sock"
    assert len(str(sock)) > 107
    p = run(
        "run", "--sim", "h100-8x-nvlink", "--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig",
        "--plugin-dir", str(plugins), "--registry-dir", str(tmp_path / "reg"),
        "--cdi-root", str(tmp_path / "cdi"), "--pod-uid", pod_uid,
    )  # fmt: skip
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"unix socket path {sock} is {len(str(sock))} bytes" in p.stderr
    assert "at most 107" in p.stderr and "Shorten --plugin-dir" in p.stderr
    # Refused before anything else: not the kubeconfig error that would come next.
    assert "Kubernetes configuration" not in p.stderr
    assert not list(plugins.glob("*.sock"))


def test_a_long_registry_dir_names_its_own_setting(tmp_path: Path):
    reg = tmp_path / ("r" * 90)
    p = run(
        "run", "--sim", "h100-8x-nvlink", "--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig",
        "--plugin-dir", str(tmp_path / "p"), "--registry-dir", str(reg), "--cdi-root", str(tmp_path / "cdi"),
    )  # fmt: skip
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert (
        f"unix socket path {reg}/gpu.nvidia.com-reg.sock" in p.stderr and "Shorten --registry-dir" in p.stderr
    )
