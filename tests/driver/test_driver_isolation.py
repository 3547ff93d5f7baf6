"""Isolation between claims: no GPU prepared twice by accident, no setting left for the next claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from driver_helpers import InMemoryClaims, make_claim, make_state, opaque

from driver.sharing import CapacitySharing
from driver.state import ClaimRef, DeviceState

TIMESLICE_LONG = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}


def prepare(state: DeviceState, claims: InMemoryClaims, name: str, uid: str, device: str = "gpu-1",
            **kw: Any) -> str:  # fmt: skip
    obj = claims.add(make_claim(name, uid, [("gpu", device)], **kw))
    return state.prepare(ClaimRef("default", obj["metadata"]["name"], uid)).error


def timeslice(state: DeviceState, minor: int) -> int | None:
    assert state.nvml is not None
    (gpu,) = [g for g in state.nvml.lib.gpus if g.minor == minor]
    value: int | None = gpu.timeslice
    return value


def test_a_gpu_prepared_for_one_claim_is_refused_to_another(short_dir: Path) -> None:
    claims = InMemoryClaims()
    state = make_state(short_dir, claims)
    assert prepare(state, claims, "first", "uid-1") == ""
    err = prepare(state, claims, "second", "uid-2")
    assert "device gpu-1 is already prepared for claim default/first (uid-1)" in err
    assert "sharing.strategy TimeSlicing" in err  # says how to share on purpose
    assert set(state.checkpoint.load()) == {"uid-1"}
    assert sorted(p.name for p in (short_dir / "cdi").iterdir()) == ["k8s.gpu.nvidia.com-claim_uid-1.json"]
    assert prepare(state, claims, "first", "uid-1") == ""  # the same claim again is fine (kubelet retries)
    assert state.unprepare(ClaimRef("default", "first", "uid-1")) == ""
    assert prepare(state, claims, "second", "uid-2") == ""  # free again once unprepared


def test_two_claims_share_a_gpu_only_when_both_configure_sharing(short_dir: Path) -> None:
    claims = InMemoryClaims()
    state = make_state(short_dir, claims)
    shared = [opaque(TIMESLICE_LONG)]
    assert prepare(state, claims, "a", "uid-a", config=shared) == ""
    assert "already prepared for claim default/a" in prepare(state, claims, "b", "uid-b")
    assert prepare(state, claims, "c", "uid-c", config=shared) == ""
    assert set(state.checkpoint.load()) == {"uid-a", "uid-c"}


def test_share_ids_and_admin_access_mark_intended_sharing(short_dir: Path) -> None:
    claims = InMemoryClaims()
    state = make_state(short_dir, claims, sharing=CapacitySharing())  # shareIDs: GPUs shared by capacity
    ten = {"consumedCapacity": {"memory": "10Gi"}}
    for name, uid, extra in (("s1", "uid-s1", {"shareID": "a1", **ten}),
                             ("s2", "uid-s2", {"shareID": "b2", **ten}),
                             ("adm", "uid-adm", {"adminAccess": True})):  # fmt: skip
        obj = make_claim(name, uid, [("gpu", "gpu-4")])
        obj["status"]["allocation"]["devices"]["results"][0].update(extra)
        claims.add(obj)
        assert state.prepare(ClaimRef("default", name, uid)).error == "", name
    saved = json.loads((short_dir / "plugins" / "checkpoint.json").read_text())["v2"]["preparedClaims"]
    assert saved["uid-adm"]["preparedDevices"][0]["adminAccess"] is True
    assert "already prepared" in prepare(state, claims, "plain", "uid-plain", "gpu-4")


def test_unprepare_resets_the_time_slice_once_no_claim_uses_it(short_dir: Path) -> None:
    claims = InMemoryClaims()
    state = make_state(short_dir, claims)
    shared = [opaque(TIMESLICE_LONG)]
    assert prepare(state, claims, "a", "uid-a", config=shared) == ""
    assert prepare(state, claims, "b", "uid-b", config=shared) == ""
    assert timeslice(state, 1) == 3  # Long
    assert state.unprepare(ClaimRef("default", "a", "uid-a")) == ""
    assert timeslice(state, 1) == 3  # claim b still time-slices the GPU
    assert state.unprepare(ClaimRef("default", "b", "uid-b")) == ""
    assert timeslice(state, 1) == 0  # Default: the next claim does not inherit Long
    assert state.unprepare(ClaimRef("default", "b", "uid-b")) == ""  # idempotent, nothing to reset


def test_a_restarted_plugin_still_resets_what_an_older_run_set(short_dir: Path) -> None:
    claims = InMemoryClaims()
    state = make_state(short_dir, claims)
    assert prepare(state, claims, "a", "uid-a", "gpu-6", config=[opaque(TIMESLICE_LONG)]) == ""
    again = make_state(short_dir, claims, nvml=state.nvml)  # the checkpoint records the setting
    assert again.unprepare(ClaimRef("default", "a", "uid-a")) == ""
    assert timeslice(again, 6) == 0
