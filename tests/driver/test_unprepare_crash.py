"""Unprepare killed between its two steps, and prepare of a claim whose CDI spec went missing.

The invariant checked throughout: a claim the checkpoint holds as PrepareCompleted always has its
CDI spec on disk, and after start-up recovery no CDI spec is left for a claim not in the checkpoint.
A re-prepare must answer with CDI ids that the spec on disk actually defines.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from driver_helpers import InMemoryClaims, make_claim, make_state

from driver.checkpoint import PREPARE_COMPLETED, Checkpoint
from driver.state import ClaimRef
from tests.reliability.plugin_process import Plugin as PluginProcess

ROOT = Path(__file__).resolve().parents[2]

KEEP = make_claim("keep", "uid-keep", [("gpu", "gpu-0")])
VICTIM = make_claim("victim", "uid-victim", [("gpu", "gpu-1"), ("gpu", "gpu-2")])
UNPREPARE_POINTS = ("before-unprepare", "after-unprepare-checkpoint", "after-cdi-removed")


class Plugin(PluginProcess):
    """The real plugin (gRPC over unix sockets, real files) with the two claims these tests use."""

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.claims(KEEP, VICTIM)


@pytest.fixture
def plugin(short_dir: Path) -> Iterator[Plugin]:
    p = Plugin(short_dir)
    try:
        yield p
    finally:
        p.stop()


def spec_ids(base: Path, uid: str) -> set[str] | None:
    """CDI ids defined by the claim's spec file, read straight from disk; None when absent."""
    path = base / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json"
    if not path.exists():
        return None
    spec = json.loads(path.read_text())
    return {f"{spec['kind']}={d['name']}" for d in spec["devices"]}


def spec_uids(base: Path) -> set[str]:
    prefix, suffix = "k8s.gpu.nvidia.com-claim_", ".json"
    d = base / "cdi"
    return {p.name[len(prefix) : -len(suffix)] for p in d.iterdir()} if d.is_dir() else set()


def completed(base: Path) -> set[str]:
    return {u for u, e in Checkpoint(base / "plugins").load().items() if e.state == PREPARE_COMPLETED}


def assert_prepared_have_specs(base: Path) -> None:
    for uid, entry in Checkpoint(base / "plugins").load().items():
        if entry.state != PREPARE_COMPLETED:
            continue
        ids = spec_ids(base, uid)
        assert ids is not None, f"claim {uid} is recorded as prepared but its CDI spec is gone"
        recorded = {i for d in entry.devices for i in d.cdi_device_ids}
        assert recorded <= ids, (recorded, ids)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", UNPREPARE_POINTS)
async def test_unprepare_killed_at_each_step_keeps_the_invariant(plugin: Plugin, point: str) -> None:
    plugin.start()
    k = await plugin.kubelet()
    first = await k.prepare(KEEP, VICTIM)
    assert all(c.error == "" for c in first.claims.values())
    await k.close()
    plugin.stop()

    plugin.start(crash_at=point)
    k = await plugin.kubelet()
    with pytest.raises(grpc.aio.AioRpcError):  # the plugin dies inside the call
        await k.unprepare(VICTIM)
    await k.close()
    assert plugin.proc is not None and plugin.proc.wait(timeout=30) == 137
    assert_prepared_have_specs(plugin.base)  # holds at the instant of the crash, before any recovery

    report = plugin.start()
    assert_prepared_have_specs(plugin.base)
    assert spec_uids(plugin.base) == completed(plugin.base)  # recovery leaves no spec without a claim
    if point == "after-unprepare-checkpoint":
        assert report["orphans"] == ["uid-victim"], report

    # A re-prepare (the pod recreated before the kubelet retried the unprepare) answers ids that resolve.
    k = await plugin.kubelet()
    again = await k.prepare(VICTIM)
    await k.close()
    res = again.claims["uid-victim"]
    assert res.error == ""
    ids = {i for d in res.devices for i in d.cdi_device_ids}
    on_disk = spec_ids(plugin.base, "uid-victim")
    assert on_disk is not None and ids and ids <= on_disk, (ids, on_disk)
    assert_prepared_have_specs(plugin.base)
    assert spec_uids(plugin.base) == completed(plugin.base) == {"uid-keep", "uid-victim"}


@pytest.mark.timeout(120)
async def test_unprepare_killed_between_steps_then_retried(plugin: Plugin) -> None:
    plugin.start()
    k = await plugin.kubelet()
    await k.prepare(KEEP, VICTIM)
    await k.close()
    plugin.stop()
    plugin.start(crash_at="after-unprepare-checkpoint")
    k = await plugin.kubelet()
    with pytest.raises(grpc.aio.AioRpcError):
        await k.unprepare(VICTIM)
    await k.close()
    assert plugin.proc is not None and plugin.proc.wait(timeout=30) == 137
    # Killed between the steps: the entry is gone, the spec lingers until recovery or a retry.
    assert "uid-victim" not in completed(plugin.base)
    assert "uid-victim" in spec_uids(plugin.base)

    plugin.start()
    k = await plugin.kubelet()
    out = await k.unprepare(VICTIM)  # the kubelet's retry succeeds although nothing is left to do
    await k.close()
    assert out.claims["uid-victim"].error == ""
    assert spec_uids(plugin.base) == completed(plugin.base) == {"uid-keep"}


@pytest.mark.parametrize("damage", ["deleted", "truncated", "other-devices"])
def test_prepare_of_completed_claim_rewrites_a_missing_spec(short_dir: Path, damage: str) -> None:
    claims = InMemoryClaims()
    claims.add(VICTIM)
    state = make_state(short_dir, claims)
    ref = ClaimRef("default", "victim", "uid-victim")
    first = state.prepare(ref)
    assert first.error == ""
    path = short_dir / "cdi" / "k8s.gpu.nvidia.com-claim_uid-victim.json"
    if damage == "deleted":  # what an older driver's unprepare left when killed mid-way
        path.unlink()
    elif damage == "truncated":
        path.write_text(path.read_text()[:40])
    else:
        spec = json.loads(path.read_text())
        spec["devices"] = spec["devices"][:1]
        path.write_text(json.dumps(spec))
    claims.delete("default", "victim")  # the rewrite works from the checkpoint, without the API

    again = state.prepare(ref)
    assert again.error == ""
    assert [d.cdi_device_ids for d in again.devices] == [d.cdi_device_ids for d in first.devices]
    on_disk = spec_ids(short_dir, "uid-victim")
    assert on_disk == {i for d in again.devices for i in d.cdi_device_ids}
    assert_prepared_have_specs(short_dir)
