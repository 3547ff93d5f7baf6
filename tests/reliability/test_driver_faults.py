"""The DRA plugin killed (exit 137, no cleanup) at every step of prepare and unprepare, then restarted.

After each restart: no CDI spec exists for a claim the checkpoint does not hold as prepared (no
leak), a kubelet retry of the interrupted call succeeds, and a claim that was fully prepared before
the crash is still prepared afterwards (nothing lost). Also: a corrupted checkpoint is caught by its
checksum and rebuilt, and the real `draguard driver run` keeps retrying, with growing delays, while
the API server is down, then publishes its ResourceSlices once it is back.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from driver.checkpoint import PREPARE_COMPLETED, Checkpoint, CheckpointCorrupt
from tests.driver.driver_helpers import make_claim
from tests.reliability.conftest import unavailable
from tests.reliability.plugin_process import Plugin

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
PREPARE_POINTS = (
    "before-prepare-checkpoint",
    "after-prepare-started",
    "after-cdi-written",
    "after-prepare-completed",
)
UNPREPARE_POINTS = ("before-unprepare", "after-unprepare-checkpoint", "after-cdi-removed")




@pytest.fixture
def plugin() -> Iterator[Plugin]:
    d = Path(tempfile.mkdtemp(prefix="dgr-", dir="/tmp"))  # unix socket paths must stay short
    p = Plugin(d)
    try:
        yield p
    finally:
        p.stop()
        shutil.rmtree(d, ignore_errors=True)


KEEP = make_claim("keep", "uid-keep", [("gpu", "gpu-0")])
VICTIM = make_claim("victim", "uid-victim", [("gpu", "gpu-1"), ("gpu", "gpu-2")])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", PREPARE_POINTS)
async def test_kill_during_prepare(plugin: Plugin, point: str) -> None:
    plugin.claims(KEEP, VICTIM)
    plugin.start()
    k = await plugin.kubelet()
    before = await k.prepare(KEEP)
    assert before.claims["uid-keep"].error == ""
    await k.close()
    plugin.stop()

    plugin.start(crash_at=point)
    k = await plugin.kubelet()
    with pytest.raises(grpc.aio.AioRpcError):  # the process dies inside the call
        await k.prepare(VICTIM)
    await k.close()
    assert plugin.wait() == 137

    report = plugin.start()
    plugin.assert_consistent()
    assert "uid-keep" in report["kept"], report
    if point == "after-prepare-completed":
        assert "uid-victim" in report["kept"]
    k = await plugin.kubelet()
    again = await k.prepare(KEEP, VICTIM)  # the kubelet retries; the finished claim answers the same
    assert again.claims["uid-victim"].error == "" and again.claims["uid-keep"].error == ""
    assert again.claims["uid-keep"] == before.claims["uid-keep"]
    assert plugin.checkpoint() == {"uid-keep": PREPARE_COMPLETED, "uid-victim": PREPARE_COMPLETED}
    plugin.assert_consistent()
    await k.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", UNPREPARE_POINTS)
async def test_kill_during_unprepare(plugin: Plugin, point: str) -> None:
    plugin.claims(KEEP, VICTIM)
    plugin.start()
    k = await plugin.kubelet()
    r = await k.prepare(KEEP, VICTIM)
    assert all(c.error == "" for c in r.claims.values())
    await k.close()
    plugin.stop()

    plugin.start(crash_at=point)
    k = await plugin.kubelet()
    with pytest.raises(grpc.aio.AioRpcError):
        await k.unprepare(VICTIM)
    await k.close()
    assert plugin.wait() == 137

    report = plugin.start()
    assert "uid-keep" in report["kept"], report
    # The entry goes before the spec, so every claim still recorded as prepared has its spec, and a
    # spec left without an entry (killed between the two) does not survive the restart.
    plugin.assert_consistent()
    k = await plugin.kubelet()
    out = await k.unprepare(VICTIM)  # the kubelet retries the unprepare
    assert out.claims["uid-victim"].error == ""
    assert plugin.checkpoint() == {"uid-keep": PREPARE_COMPLETED}
    plugin.assert_consistent()
    kept = await k.prepare(KEEP)
    assert kept.claims["uid-keep"].error == ""
    await k.close()


@pytest.mark.timeout(120)
async def test_corrupted_checkpoint_is_detected_and_rebuilt(plugin: Plugin) -> None:
    plugin.claims(KEEP)
    plugin.start()
    k = await plugin.kubelet()
    first = await k.prepare(KEEP)
    await k.close()
    plugin.stop()
    cp = plugin.base / "plugins" / "checkpoint.json"
    text = cp.read_text()
    cp.write_text(text.replace("gpu-0", "gpu-7"))  # valid JSON, wrong content
    with pytest.raises(CheckpointCorrupt, match="checksum"):
        Checkpoint(plugin.base / "plugins").load()

    report = plugin.start()
    assert report["quarantined"] and Path(report["quarantined"]).exists()
    assert report["orphans"] == ["uid-keep"]  # a spec the (unreadable) checkpoint cannot vouch for
    plugin.assert_consistent()
    k = await plugin.kubelet()
    again = await k.prepare(KEEP)  # rebuilt from the API's allocation
    assert again.claims["uid-keep"].error == ""
    assert [d.device_name for d in again.claims["uid-keep"].devices] == [
        d.device_name for d in first.claims["uid-keep"].devices
    ]
    plugin.assert_consistent()
    await k.close()


# --- API server unavailable while publishing ---------------------------------------------------


def _bin_dir() -> Path | None:
    sys.path.insert(0, str(ROOT / "tests" / "driver"))
    from tests.apiserver import find_bin

    return find_bin()


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_driver_run_retries_until_api_server_is_back(tmp_path: Path) -> None:
    bin_dir = _bin_dir()
    if bin_dir is None:
        unavailable("kube-apiserver/etcd binaries not built (scripts/build-k8s.sh)")
    from tests.apiserver import start

    base = Path(tempfile.mkdtemp(prefix="dgr-api-", dir="/tmp"))
    api = start(bin_dir, base)
    driver: subprocess.Popen[bytes] | None = None
    api_argv = list(api.procs[1].args)  # type: ignore[arg-type]
    try:
        api.request(
            "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-r"}}
        )
        # Take the API server away (etcd stays), then start the driver against it.
        api.procs[1].terminate()
        api.procs[1].wait(timeout=30)
        d = Path(tempfile.mkdtemp(prefix="dgr-drv-", dir="/tmp"))
        log = open(tmp_path / "driver.log", "wb")  # noqa: SIM115
        driver = subprocess.Popen(
            [sys.executable, "-m", "webhook.cli", "driver", "run", "--node-name", "node-r",
             "--sim", str(ROOT / "driver/sim/topologies/a100-4x-nvlink.yaml"),
             "--kubeconfig", str(api.kubeconfig), "--plugin-dir", str(d / "plugins"),
             "--registry-dir", str(d / "registry"), "--cdi-root", str(d / "cdi"), "--metrics-port", "0"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
        log.close()
        time.sleep(9)  # 0.5 + 1 + 2 + 4 s of backoff
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-2000:]
        text = (tmp_path / "driver.log").read_text()
        delays = [float(x) for x in re.findall(r"API server unavailable .*?retrying in ([0-9.]+)s", text)]
        assert len(delays) >= 3, text[-2000:]
        assert delays == sorted(delays) and delays[-1] > delays[0], delays
        # The API server comes back on the same address.
        alog = open(base / "apiserver-2.log", "wb")  # noqa: SIM115
        api.procs[1] = subprocess.Popen(api_argv, stdout=alog, stderr=subprocess.STDOUT)
        alog.close()
        deadline = time.monotonic() + 150
        items: list[Any] = []
        while time.monotonic() < deadline:
            try:
                items = [
                    s
                    for s in api.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
                    if s["spec"].get("nodeName") == "node-r"
                ]
            except OSError:
                items = []
            if items:
                break
            time.sleep(1)
        assert items, (tmp_path / "driver.log").read_text()[-3000:]
        assert sum(len(s["spec"]["devices"]) for s in items) == 4
        assert driver.poll() is None
    finally:
        if driver is not None and driver.poll() is None:
            driver.terminate()
            driver.wait(timeout=30)
        api.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(120)
async def test_prepare_after_interrupted_unprepare_has_its_cdi_spec(plugin: Plugin) -> None:
    plugin.claims(KEEP, VICTIM)
    plugin.start()
    k = await plugin.kubelet()
    await k.prepare(KEEP, VICTIM)
    await k.close()
    plugin.stop()
    plugin.start(crash_at="after-unprepare-checkpoint")  # between the two unprepare steps
    k = await plugin.kubelet()
    with pytest.raises(grpc.aio.AioRpcError):
        await k.unprepare(VICTIM)
    await k.close()
    assert plugin.wait() == 137
    plugin.start()
    k = await plugin.kubelet()
    out = await k.prepare(VICTIM)  # e.g. the pod was recreated before the kubelet retried unprepare
    await k.close()
    assert out.claims["uid-victim"].error == ""
    assert "uid-victim" in plugin.cdi_uids(), "prepare answered success without a CDI spec"
