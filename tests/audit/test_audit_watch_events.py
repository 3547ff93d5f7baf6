"""The audit's watch events without a server: debouncing, which events matter, and hostile events
(huge, deeply nested, endless lines) held within bounds."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from webhook.audit.owners import OwnerIndex
from webhook.audit.watch import (
    Changes,
    Fingerprints,
    ResourceWatch,
    Scope,
    Watched,
    event_lines,
    watched_resources,
)
from webhook.server.caches import Gone, KubeHttp

DEPLOYMENTS = Watched("/apis/apps/v1/deployments", "apps/v1", "Deployment")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_in_one_namespace_is_one_rescan_after_the_quiet() -> None:
    clock = Clock()
    ch = Changes(debounce=1.0, max_delay=10.0, clock=clock)
    for _ in range(50):
        ch.touch("ml")
        clock.now += 0.1
    assert ch.due() == ([], pytest.approx(0.9))
    clock.now += 0.9
    assert ch.due() == (["ml"], None)
    assert ch.due() == ([], None)


def test_a_namespace_that_never_goes_quiet_is_rescanned_at_the_max_delay() -> None:
    clock = Clock()
    ch = Changes(debounce=1.0, max_delay=3.0, clock=clock)
    rescans = 0
    for _ in range(100):  # an event every 0.5 s for 50 s
        ch.touch("busy")
        clock.now += 0.5
        rescans += len(ch.due()[0])
    assert 12 <= rescans <= 17  # about every 3 s, never per event


def test_too_many_namespaces_waiting_become_one_full_scan() -> None:
    clock = Clock()
    ch = Changes(debounce=1.0, max_pending=10, clock=clock)
    for i in range(11):
        ch.touch(f"ns-{i}")
    assert ch.full_since == 100.0 and ch.pending() == 0
    clock.now += 5
    ch.full_started(101.0)  # a full scan that began after the request answers it
    assert ch.full_since is None


def test_a_change_during_a_full_scan_is_judged_after_it() -> None:
    clock = Clock()
    ch = Changes(debounce=0.0, clock=clock)
    ch.touch("before")
    clock.now = 110.0
    ch.request_full()
    clock.now = 120.0  # the scan starts at 115 and lists "during" before its change at 120
    ch.touch("during")
    ch.full_started(115.0)
    assert ch.full_since is None
    assert ch.due()[0] == ["during"]


def _watch(changes: Changes) -> ResourceWatch:
    http = KubeHttp(None)  # handle() never calls the API server
    return ResourceWatch(http, DEPLOYMENTS, changes, Fingerprints())


def _deployment(name: str, gpu: bool = True, **extra: Any) -> dict[str, Any]:
    res = {"limits": {"nvidia.com/gpu": 1}} if gpu else {}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "resourceVersion": "7"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "c", "image": "cuda", "resources": res, **extra}]}}
        },
    }


def _line(typ: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": typ, "object": obj}).encode()


def test_status_only_updates_and_pods_of_judged_controllers_are_ignored() -> None:
    ch = Changes(debounce=0.0)
    w = _watch(ch)
    dep = _deployment("a")
    w.handle(_line("ADDED", dep))
    assert ch.due()[0] == ["ml"] and w.resource_version == "7"
    w.handle(_line("MODIFIED", {**dep, "status": {"readyReplicas": 1}}))
    assert ch.due()[0] == []
    changed = _deployment("a")
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "cuda:12"
    w.handle(_line("MODIFIED", changed))
    assert ch.due()[0] == ["ml"]
    owners = OwnerIndex()
    owners.add({**_deployment("a-1"), "kind": "ReplicaSet"})
    w.scope = Scope(owners=owners)
    ref = {"kind": "ReplicaSet", "name": "a-1", "uid": "uid-a-1", "controller": True}
    pod = _deployment("p")
    pod["metadata"]["ownerReferences"] = [ref]
    w.handle(_line("ADDED", pod))
    assert ch.due()[0] == []  # the owner was listed, and its template makes this
    # One that names the owner but runs something else, or names an owner never listed, is judged.
    forged = _deployment("q")
    forged["spec"]["template"]["spec"]["containers"][0]["image"] = "miner"
    forged["metadata"]["ownerReferences"] = [ref]
    w.handle(_line("ADDED", forged))
    assert ch.due()[0] == ["ml"]
    ghost = _deployment("r")
    ghost["metadata"]["ownerReferences"] = [{**ref, "uid": "uid-none"}]
    w.handle(_line("ADDED", ghost))
    assert ch.due()[0] == ["ml"]
    # A deletion matters when the object used devices; one that never did cannot be in a report.
    w.handle(_line("DELETED", _deployment("b", gpu=False)))
    assert ch.due()[0] == []
    w.handle(_line("DELETED", dep))
    assert ch.due()[0] == ["ml"]


SLICES = Watched("/apis/resource.k8s.io/v1/resourceslices", "resource.k8s.io/v1", "ResourceSlice", "full")


def _slice(devices: list[str], generation: int = 0, rv: str = "11") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.nvidia.com", "uid": "uid-slice", "resourceVersion": rv},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": d} for d in devices],
        },
    }


def test_a_slice_that_gains_or_loses_devices_asks_for_a_full_scan_once() -> None:
    clock = Clock()
    ch = Changes(debounce=0.0, clock=clock)
    w = ResourceWatch(KubeHttp(None), SLICES, ch, Fingerprints())
    w.handle(_line("ADDED", _slice(["gpu-0", "gpu-1"])))  # a node joined
    assert ch.full_since == 100.0 and ch.due()[0] == []  # no namespace: every one may change
    ch.full_started(100.0)
    # The same devices again (a relist's replay, a resync that changed nothing): no scan.
    w.handle(_line("MODIFIED", _slice(["gpu-0", "gpu-1"], rv="12")))
    assert ch.full_since is None
    clock.now = 110.0
    w.handle(_line("MODIFIED", _slice(["gpu-0"], generation=1, rv="13")))  # a GPU went away
    assert ch.full_since == 110.0
    ch.full_started(110.0)
    clock.now = 120.0
    w.handle(_line("DELETED", _slice(["gpu-0"], generation=1, rv="14")))  # the node left
    assert ch.full_since == 120.0


def test_slices_and_classes_are_watched_for_full_scans() -> None:
    class Discovery(KubeHttp):
        def get_json(self, path: str, query: Any = None, timeout: float = 10.0) -> dict[str, Any]:
            assert path == "/apis/resource.k8s.io"
            return {"versions": [{"version": "v1"}], "preferredVersion": {"version": "v1"}}

    full = {r.kind for r in watched_resources(Discovery(None), []) if r.effect == "full"}
    assert full == {"DeviceClass", "ResourceSlice"}


def test_bookmarks_move_the_resource_version_and_410_is_gone() -> None:
    w = _watch(Changes())
    w.handle(_line("BOOKMARK", {"kind": "Deployment", "metadata": {"resourceVersion": "99"}}))
    assert w.resource_version == "99"
    with pytest.raises(Gone):
        w.handle(_line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}))


def test_a_deeply_nested_event_is_read_with_the_deep_part_cut_off() -> None:
    ch = Changes(debounce=0.0)
    w = _watch(ch)
    dep = json.dumps(_deployment("deep", extra="DEEP")).encode()
    dep = dep.replace(b'"DEEP"', b"[" * 100_000 + b"]" * 100_000)
    w.handle(b'{"type":"ADDED","object":' + dep + b"}")
    assert ch.due()[0] == ["ml"] and ch.full_since is None


def test_an_event_that_cannot_be_read_asks_for_a_full_scan() -> None:
    ch = Changes()
    w = _watch(ch)
    w.handle(b'{"type":"ADDED","object":{"metadata":')  # cut short
    assert ch.full_since is not None and ch.pending() == 0
    w.handle(b"[1, 2]")  # not an event: ignored


def test_a_huge_object_is_not_kept() -> None:
    ch = Changes(debounce=0.0)
    w = _watch(ch)
    env = [{"name": f"V{i}", "value": "x" * 1000} for i in range(1400)]  # about 1.4 MiB, as etcd allows
    lines = [_line("ADDED", _deployment(f"big-{i}", env=env)) for i in range(20)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for line in lines:
            w.handle(line)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert ch.due()[0] == ["ml"]
    assert kept < 256 * 1024, kept  # 20 fingerprints, not 28 MiB of objects
    assert len(w.fps) == 20


def _chunks(total: int, chunk: int = 64 * 1024) -> Iterator[bytes]:
    for _ in range(total // chunk):
        yield b"x" * chunk
    yield b'\n{"type":"BOOKMARK"}\n'


def test_an_endless_line_is_skipped_within_the_limit() -> None:
    tracemalloc.start()
    try:
        got = list(event_lines(_chunks(64 * 1024 * 1024), limit=1024 * 1024))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == [None, b'{"type":"BOOKMARK"}']
    assert peak < 4 * 1024 * 1024, peak  # the limit and a chunk, not the 64 MiB line


def test_lines_split_across_chunks_are_joined() -> None:
    chunks = [b'{"a":', b"1}\n", b"\n", b'{"b":2}\n{"c"', b":3}"]
    assert list(event_lines(iter(chunks))) == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
