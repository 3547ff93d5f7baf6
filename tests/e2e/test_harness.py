"""The harness itself, without Kubernetes binaries: process bookkeeping and safe tear-down, error texts.

Not marked e2e (see conftest): these run in every test run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from webhook.dev.cluster import (
    REPO_ROOT,
    ClusterError,
    LocalCluster,
    find_bin_dir,
    generated_webhook_configs,
    pid_alive,
)


def _cluster(tmp_path: Path) -> LocalCluster:
    c = LocalCluster(tmp_path / "state", tmp_path / "bin", progress=lambda _m: None)
    c.paths.root.mkdir(parents=True)
    c.state = {"pids": {}, "order": [], "ports": {}}
    return c


def test_down_stops_what_it_started_and_nothing_else(tmp_path: Path) -> None:
    c = _cluster(tmp_path)
    pid = c._spawn("sleeper", ["sleep", "60"])
    assert c.running() == {"sleeper": pid}
    # Bookkeeping that must never lead to a signal: this test process, pid 1, and a live process
    # whose pid is recorded under a different start time (a recycled pid).
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        c.state["pids"].update({"self": os.getpid(), "init": 1, "recycled": stranger.pid})
        c.state["starts"].update({"self": "0", "init": "0", "recycled": "1"})
        c._save_state()
        assert set(c.running()) == {"sleeper"}
        assert c.down() == ["sleeper"]
        assert not pid_alive(pid)
        assert stranger.poll() is None, "a process the harness did not start was signalled"
        assert not list(c.paths.pids.glob("*.pid"))
    finally:
        stranger.kill()
        stranger.wait()


def test_down_from_pid_files_alone(tmp_path: Path) -> None:
    """A state.json lost mid-start: the pid files (pid and start time) are enough to clean up."""
    c = _cluster(tmp_path)
    pid = c._spawn("sleeper", ["sleep", "60"])
    c.paths.state.unlink()
    again = LocalCluster(c.paths.root, tmp_path / "bin", progress=lambda _m: None)
    assert again.down() == ["sleeper"]
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid)


def test_start_failure_names_the_component_and_log(tmp_path: Path) -> None:
    c = _cluster(tmp_path)
    c._spawn("broken", ["sh", "-c", "echo 'flag provided but not defined: -bogus' >&2; exit 2"])
    with pytest.raises(ClusterError) as err:
        c._wait("broken", lambda: False, timeout=10)
    assert "broken exited during start-up" in str(err.value)
    assert "flag provided but not defined: -bogus" in str(err.value)


def test_missing_binaries_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "etcd").write_text("")
    monkeypatch.setenv("DRAGUARD_K8S_BIN", str(tmp_path))
    with pytest.raises(ClusterError) as err:
        find_bin_dir()
    assert "missing etcd, kube-apiserver" in str(err.value)
    assert "scripts/build-k8s.sh" in str(err.value)
    monkeypatch.delenv("DRAGUARD_K8S_BIN")
    monkeypatch.setenv("DRAGUARD_K8S_CACHE", str(tmp_path / "empty"))
    with pytest.raises(ClusterError, match="no Kubernetes binaries under"):
        find_bin_dir()


def test_generated_webhook_configs_exclude_system_namespaces() -> None:
    mutating, validating = generated_webhook_configs(9443, "Q0E=")
    assert mutating["webhooks"][0]["failurePolicy"] == "Ignore"
    assert validating["webhooks"][0]["failurePolicy"] == "Fail"
    for cfg in (mutating, validating):
        hook = cfg["webhooks"][0]
        assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:9443/")
        excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert {"kube-system", "draguard-system", "draguard-driver"} <= set(excluded)
    json.dumps([mutating, validating])


def test_refuses_to_wipe_a_foreign_directory(tmp_path: Path) -> None:
    keep = tmp_path / "important.txt"
    keep.write_text("user data")
    c = LocalCluster(tmp_path, tmp_path / "bin", progress=lambda _m: None)
    with pytest.raises(ClusterError, match="not a draguard dev state directory"):
        c._reset_state_dir()
    assert keep.read_text() == "user data"


def test_tied_components_die_with_their_parent(tmp_path: Path) -> None:
    """A killed test run leaves nothing behind: components started with tie_to_parent get SIGTERM."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from webhook.dev.cluster import LocalCluster\n"
        f"c = LocalCluster(Path({str(tmp_path / 'state')!r}), Path('/nonexistent'), tie_to_parent=True)\n"
        "c.paths.root.mkdir(parents=True)\n"
        "print(c._spawn('sleeper', ['sleep', '60']), flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert pid_alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)
