"""Readiness tells the truth: a real `draguard serve` watching a real kube-apiserver goes unready
when its watches have been broken longer than --watch-stale-after, and ready again once they
are back (the API server then calls other replicas, or applies failurePolicy)."""

from __future__ import annotations

import http.client
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import ROOT, draguard, free_port, unavailable


def _ready(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    try:
        conn.request("GET", "/readyz")
        r = conn.getresponse()
        return r.status, r.read().decode()
    except OSError as e:
        return 0, str(e)
    finally:
        conn.close()


def _wait(port: int, status: int, timeout: float, log: Path) -> str:
    deadline = time.monotonic() + timeout
    last = (0, "")
    while time.monotonic() < deadline:
        last = _ready(port)
        if last[0] == status:
            return last[1]
        time.sleep(0.2)
    raise AssertionError(f"/readyz never {status} (last {last}):\n{log.read_text()[-3000:]}")


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_unready_while_the_api_server_is_gone(tmp_path: Path, certs: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "driver"))
    from tests.apiserver import find_bin, start

    bin_dir = find_bin()
    if bin_dir is None:
        unavailable("kube-apiserver/etcd binaries not built (scripts/build-k8s.sh)")
        return
    base = Path(tempfile.mkdtemp(prefix="dgr-ready-", dir="/tmp"))
    api = start(bin_dir, base, runtime_config="resource.k8s.io/v1=true")
    api_argv = list(api.procs[1].args)  # type: ignore[arg-type]
    probe = free_port()
    log = tmp_path / "webhook.log"
    out = open(log, "wb")  # noqa: SIM115 - the child owns it
    hook = subprocess.Popen(
        draguard(
            "serve", "--host", "127.0.0.1", "--port", str(free_port()), "--probe-port", str(probe),
            "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
            "--policies", str(ROOT / "policies"), "--kubeconfig", str(api.kubeconfig),
            "--watch-stale-after", "3", "--shutdown-delay", "0",
        ),
        stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip
    out.close()
    try:
        _wait(probe, 200, 90, log)
        api.procs[1].kill()  # lost, not shut down (a graceful stop waits for the watches to end)
        api.procs[1].wait(timeout=30)
        why = _wait(probe, 503, 30, log)
        assert "watch broken for over 3 s" in why, why
        alog = open(base / "apiserver-2.log", "wb")  # noqa: SIM115
        api.procs[1] = subprocess.Popen(api_argv, stdout=alog, stderr=subprocess.STDOUT)
        alog.close()
        _wait(probe, 200, 120, log)
        assert hook.poll() is None
    finally:
        if hook.poll() is None:
            hook.terminate()
            hook.wait(timeout=30)
        api.stop()
        shutil.rmtree(base, ignore_errors=True)
