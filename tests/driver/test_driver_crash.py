"""Crash between the two prepare phases, restart, and the checkpoint's guarantees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from driver_helpers import NODE, InMemoryClaims, Kubelet, make_claim, make_state

from driver.checkpoint import PREPARE_COMPLETED, PREPARE_STARTED, Checkpoint, CheckpointCorrupt

HERE = Path(__file__).parent


class PluginProcess:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.claims_file = base / "claims.json"
        self.proc: subprocess.Popen[str] | None = None

    def set_claims(self, *claims: dict[str, Any]) -> None:
        self.claims_file.write_text(json.dumps(list(claims)))

    def start(
        self,
        crash_at: str | None = None,
        version: str = "0.1.0",
        share_by_capacity: str | None = None,
        topology: str = "h100-8x-nvlink",
        dynamic_mig: bool = False,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        cfg = self.base / "cfg.json"
        cfg.write_text(
            json.dumps(
                {
                    "base": str(self.base),
                    "topology": topology,
                    "node": NODE,
                    "claims": str(self.claims_file),
                    "crashAt": crash_at,
                    "version": version,
                    "shareByCapacity": share_by_capacity,
                    "dynamicMig": dynamic_mig,
                }
            )
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "plugin_proc.py"), str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(
                f"plugin process failed to start: {self.proc.stderr.read() if self.proc.stderr else ''}"
            )
        return json.loads(line)

    def wait_dead(self) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture
def proc(short_dir):
    p = PluginProcess(short_dir)
    yield p
    p.stop()


def spec(base: Path, uid: str) -> Path:
    return base / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json"


@pytest.mark.parametrize("crash_at", ["after-prepare-started", "after-cdi-written"])
async def test_crash_between_phases_then_restart(proc, short_dir, crash_at):
    done = make_claim("done", "uid-done", [("gpu", "gpu-0")])
    torn = make_claim("torn", "uid-torn", [("gpu", "gpu-1"), ("gpu", "gpu-2")])
    proc.set_claims(done, torn)
    proc.start(crash_at=crash_at)

    kubelet = Kubelet(short_dir / "registry" / "gpu.nvidia.com-reg.sock")
    await kubelet.register()
    with pytest.raises(grpc.aio.AioRpcError):  # the plugin dies inside this call
        await kubelet.prepare(done)
    await kubelet.close()
    assert proc.wait_dead() == 137
    cp = Checkpoint(short_dir / "plugins").load()
    assert cp["uid-done"].state == PREPARE_STARTED  # phase 1 recorded, phase 2 never reached
    assert spec(short_dir, "uid-done").exists() == (crash_at == "after-cdi-written")

    # Restart without the fault: the half-prepared claim is rolled back, nothing leaks.
    report = proc.start()
    assert report["rolledBack"] == ["uid-done"]
    assert not spec(short_dir, "uid-done").exists()
    assert Checkpoint(short_dir / "plugins").load() == {}

    # The kubelet retries both claims: they are prepared now, and stay prepared across a clean restart.
    kubelet = Kubelet(short_dir / "registry" / "gpu.nvidia.com-reg.sock")
    await kubelet.register()
    resp = await kubelet.prepare(done, torn)
    assert resp.claims["uid-done"].error == "" and resp.claims["uid-torn"].error == ""
    await kubelet.close()
    proc.stop()
    report = proc.start()
    assert sorted(report["kept"]) == ["uid-done", "uid-torn"] and not report["rolledBack"]
    kubelet = Kubelet(short_dir / "registry" / "gpu.nvidia.com-reg.sock")
    await kubelet.register()
    again = await kubelet.prepare(done, torn)
    assert again == resp  # no claim lost
    assert spec(short_dir, "uid-done").exists() and spec(short_dir, "uid-torn").exists()
    await kubelet.close()


async def test_process_killed_mid_call_gives_kubelet_an_error_not_a_result(proc, short_dir):
    claim = make_claim("k", "uid-k")
    proc.set_claims(claim)
    proc.start(crash_at="after-cdi-written")
    kubelet = Kubelet(short_dir / "registry" / "gpu.nvidia.com-reg.sock")
    await kubelet.register()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.prepare(claim)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    await kubelet.close()


def test_recover_drops_claims_gone_from_the_api(short_dir):
    claims = InMemoryClaims()
    state = make_state(short_dir, claims)
    from driver.state import ClaimRef

    for i, (name, uid) in enumerate((("keep", "uid-keep"), ("gone", "uid-gone"), ("again", "uid-again"))):
        claims.add(make_claim(name, uid, [("gpu", f"gpu-{i}")]))
        assert state.prepare(ClaimRef("default", name, uid)).error == ""
    claims.delete("default", "gone")
    # deleted and recreated under the same name
    claims.add(make_claim("again", "uid-again-2", [("gpu", "gpu-2")]))
    (short_dir / "cdi" / "k8s.gpu.nvidia.com-claim_uid-orphan.json").write_text("{}")
    report = make_state(short_dir, claims).recover()
    assert report.kept == ["uid-keep"]
    assert sorted(report.dropped) == ["uid-again", "uid-gone"]
    assert report.orphan_specs_removed == ["uid-orphan"]
    assert sorted(p.name for p in (short_dir / "cdi").iterdir()) == ["k8s.gpu.nvidia.com-claim_uid-keep.json"]


def test_recover_keeps_claims_while_api_is_down(short_dir):
    claims = InMemoryClaims()
    state = make_state(short_dir, claims)
    from driver.state import ClaimRef

    claims.add(make_claim("c", "uid-c"))
    state.prepare(ClaimRef("default", "c", "uid-c"))
    claims.unavailable = True
    report = make_state(short_dir, claims).recover()
    assert report.kept == ["uid-c"] and spec(short_dir, "uid-c").exists()


def test_checkpoint_discarded_after_reboot(short_dir, tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    cp = Checkpoint(short_dir, boot_id_path=boot)
    from driver.checkpoint import ClaimEntry

    cp.save({"u1": ClaimEntry(PREPARE_COMPLETED, "n", "ns")})
    assert list(cp.load()) == ["u1"]
    boot.write_text("boot-2\n")
    assert cp.load() == {}


def test_corrupt_checkpoint_is_detected_and_quarantined(short_dir):
    claims = InMemoryClaims()
    state = make_state(short_dir, claims)
    from driver.state import ClaimRef

    claims.add(make_claim("c", "uid-c"))
    state.prepare(ClaimRef("default", "c", "uid-c"))
    path = short_dir / "plugins" / "checkpoint.json"
    path.write_text(path.read_text().replace("PrepareCompleted", "PrepareCompletes"))
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch"):
        Checkpoint(short_dir / "plugins").load()
    out = state.prepare(ClaimRef("default", "c", "uid-c"))
    assert "checkpoint unreadable" in out.error
    report = make_state(short_dir, claims).recover()
    assert report.checkpoint_quarantined and Path(report.checkpoint_quarantined).exists()
    assert report.orphan_specs_removed == ["uid-c"]  # unknown state: the spec is not trusted


def test_legacy_v1_checkpoint_can_be_unprepared(short_dir):
    plugins = short_dir / "plugins"
    plugins.mkdir()
    (plugins / "checkpoint.json").write_text(
        json.dumps(
            {
                "checksum": 1,
                "v1": {
                    "preparedClaims": {
                        "uid-old": {
                            "name": "old",
                            "namespace": "default",
                            "preparedDevices": [
                                {
                                    "Requests": ["gpu"],
                                    "PoolName": NODE,
                                    "DeviceName": "gpu-0",
                                    "CDIDeviceIDs": ["k8s.gpu.nvidia.com/claim=uid-old-gpu-0"],
                                }
                            ],
                        }
                    }
                },
            }
        )
    )
    (short_dir / "cdi").mkdir()
    spec(short_dir, "uid-old").write_text("{}")
    loaded = Checkpoint(plugins).load()
    assert loaded["uid-old"].devices[0].device_name == "gpu-0"
    state = make_state(short_dir, InMemoryClaims())
    from driver.state import ClaimRef

    assert state.unprepare(ClaimRef("default", "old", "uid-old")) == ""
    assert not spec(short_dir, "uid-old").exists()
    assert Checkpoint(plugins).load() == {}


def test_checkpoint_write_is_atomic(short_dir):
    """A reader never sees a torn file: the old content stays until the rename."""
    from driver.checkpoint import ClaimEntry

    cp = Checkpoint(short_dir)
    cp.save({"a": ClaimEntry(PREPARE_COMPLETED, "a", "ns")})
    before = cp.path.stat().st_ino
    cp.save({"b": ClaimEntry(PREPARE_COMPLETED, "b", "ns")})
    assert cp.path.stat().st_ino != before  # replaced by rename, not rewritten in place
    assert list(cp.load()) == ["b"]
    assert not [p for p in short_dir.iterdir() if p.name.endswith(".tmp")]
