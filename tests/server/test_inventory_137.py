"""Admission judges claims against the same 1.37 inventory as offline review: shared counters (from a
counter-only slice), DeviceTaintRules and Node labels, watched on a real kube-apiserver.

Each claim goes through the webhook's admission function with the inventory its caches built, and
through `draguard review` with an inventory file of the very objects the API server returned; the
`structure/unsatisfiable` verdicts must be the same, and the expected ones.

Skips (with the reason) when the control-plane binaries are not built; see scripts/build-k8s.sh.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.apiserver import ApiServer, find_bin, start
from tests.server.conftest import review
from webhook.dra.inventory import Inventory
from webhook.policy.load import load_policies
from webhook.server import admission
from webhook.server.admission import Snapshot
from webhook.server.caches import ClusterCache, KubeHttp
from webhook.server.metrics import Metrics
from webhook.server.overlay import Entry
from webhook.server.usage import CacheView, Rebuilder, apply_overlay

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DRA = "/apis/resource.k8s.io/v1"
NS = "team-inv"
RULE = "structure/unsatisfiable"


def device_class(name: str, scenario: str, kind: str) -> dict[str, Any]:
    expr = (
        "device.driver == 'gpu.nvidia.com'"
        f" && device.attributes['gpu.nvidia.com'].scenario == '{scenario}'"
        f" && device.attributes['gpu.nvidia.com'].type == '{kind}'"
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }


def gpu(name: str, scenario: str, kind: str = "gpu", memory: str = "80Gi", **extra: Any) -> dict[str, Any]:
    dev: dict[str, Any] = {
        "name": name,
        "attributes": {"type": {"string": kind}, "scenario": {"string": scenario}},
        "capacity": {"memory": {"value": memory}},
    }
    dev.update(extra)
    return dev


def slice_(name: str, pool: str, count: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": count},
            **spec,
        },
    }


def consumes(memory: str) -> list[dict[str, Any]]:
    return [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": memory}}}]


RACK_R2 = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r2"]}]}]}

CLUSTER: list[tuple[str, dict[str, Any]]] = [
    (f"{DRA}/deviceclasses", device_class("part-gpu", "part", "gpu")),
    (f"{DRA}/deviceclasses", device_class("part-mig", "part", "mig")),
    (f"{DRA}/deviceclasses", device_class("taint-gpu", "taint", "gpu")),
    (f"{DRA}/deviceclasses", device_class("sel-gpu", "sel", "gpu")),
    # Partitions, as 1.35+ publishes them: the counter set in a slice of its own.
    (
        f"{DRA}/resourceslices",
        slice_(
            "node-a-counters",
            "node-a",
            2,
            nodeName="node-a",
            sharedCounters=[{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}],
        ),
    ),
    (
        f"{DRA}/resourceslices",
        slice_(
            "node-a-devices",
            "node-a",
            2,
            nodeName="node-a",
            devices=[
                gpu("gpu-0", "part", consumesCounters=consumes("80Gi")),
                gpu("gpu-0-mig-0", "part", "mig", "40Gi", consumesCounters=consumes("40Gi")),
            ],
        ),
    ),
    # Two GPUs on node-b, one of them tainted by a DeviceTaintRule (not by its slice).
    (
        f"{DRA}/resourceslices",
        slice_("node-b", "node-b", 1, nodeName="node-b", devices=[gpu("b-0", "taint"), gpu("b-1", "taint")]),
    ),
    (
        f"{DRA}/devicetaintrules",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": "drain-b-1"},
            "spec": {
                "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-b", "device": "b-1"},
                "taint": {"key": "example.com/drain", "value": "maintenance", "effect": "NoSchedule"},
            },
        },
    ),
    # Per-device node selection: one device on node-c, one for nodes in rack r2.
    (
        f"{DRA}/resourceslices",
        slice_(
            "sel",
            "sel",
            1,
            perDeviceNodeSelection=True,
            devices=[gpu("s-0", "sel", nodeName="node-c"), gpu("s-1", "sel", nodeSelector=RACK_R2)],
        ),
    ),
    # Every node the slices name is in rack r1 (a node whose labels are unknown could be in r2).
    *[
        (
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"rack": "r1"}}},
        )
        for n in ("node-a", "node-b", "node-c")
    ],
]


def claim(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": list(requests)}},
    }


def request(name: str, cls: str, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, "count": count, **extra}}


TOLERATE = [{"key": "example.com/drain", "operator": "Exists", "effect": "NoSchedule"}]

# claim -> whether the claim as a whole can be allocated (False: structure/unsatisfiable on spec.devices)
CLAIMS: list[tuple[dict[str, Any], bool]] = [
    # A full GPU and its own 40Gi partition need 120Gi of an 80Gi counter set.
    (claim("full-plus-mig", request("full", "part-gpu"), request("part", "part-mig")), False),
    (claim("mig-alone", request("part", "part-mig")), True),
    # Two GPUs on node-b, one tainted NoSchedule by the rule, no toleration.
    (claim("two-tainted", request("gpus", "taint-gpu", 2)), False),
    (claim("two-tolerated", request("gpus", "taint-gpu", 2, tolerations=TOLERATE)), True),
    # s-1 is for rack r2 and node-c is in r1: no node has both devices.
    (claim("two-selected", request("gpus", "sel-gpu", 2)), False),
    (claim("one-selected", request("gpus", "sel-gpu", 1)), True),
]


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    bin_dir = find_bin()
    if bin_dir is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("kube-apiserver/etcd binaries not built (scripts/build-k8s.sh)", pytrace=False)
        pytest.skip("kube-apiserver/etcd binaries not built (see DRAGUARD_K8S_BIN)")
    base = Path(tempfile.mkdtemp(prefix="dg-inventory-137-", dir="/tmp"))
    server = start(bin_dir, base, runtime_config=None)
    try:
        server.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
        for path, obj in CLUSTER:
            server.request("POST", path, obj)
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def wait(pred: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def watched_view(api: ApiServer) -> Iterator[tuple[ClusterCache, CacheView]]:
    metrics = Metrics()
    cache = ClusterCache.connect(KubeHttp.from_kubeconfig(str(api.kubeconfig)), metrics)
    views: list[CacheView] = []
    rebuilder = Rebuilder(cache, metrics, views.append, lambda: None, debounce=0.05)
    cache.start()
    rebuilder.start()
    try:
        assert cache.wait_synced(60), cache.states()
        # Everything created before the caches started is in the first view built after sync.
        view = wait(lambda: views[-1] if views else None, what="the first view after sync")
        yield cache, view
    finally:
        rebuilder.stop()
        cache.stop()


def unsatisfiable(findings: list[tuple[str, str]]) -> list[str]:
    """The structure/unsatisfiable messages among (rule, message) pairs."""
    return sorted(message for rule, message in findings if rule == RULE)


def offline(tmp_path: Path, api: ApiServer) -> dict[str, list[str]]:
    """`draguard review` of every claim, with an inventory file of what the API server holds."""
    objs: list[dict[str, Any]] = []
    for path, kind, version in (
        (f"{DRA}/deviceclasses", "DeviceClass", "resource.k8s.io/v1"),
        (f"{DRA}/resourceslices", "ResourceSlice", "resource.k8s.io/v1"),
        (f"{DRA}/devicetaintrules", "DeviceTaintRule", "resource.k8s.io/v1"),
        ("/api/v1/nodes", "Node", "v1"),
    ):
        for item in api.request("GET", path)["items"]:
            objs.append({"apiVersion": version, "kind": kind, **item})
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump_all(objs))
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump_all([c for c, _ in CLAIMS]))
    out = tmp_path / "review.json"
    # The command a reviewer runs, in its own process: nothing shared with the caches above.
    done = subprocess.run(
        [
            *(sys.executable, "-m", "webhook.cli", "review", "--policies", str(ROOT / "policies")),
            *("--inventory", str(inv), "--format", f"json={out}", "--fail-on", "never", str(claims)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    verdicts: dict[str, list[tuple[str, str]]] = {c["metadata"]["name"]: [] for c, _ in CLAIMS}
    for f in report["findings"]:
        verdicts[f["object"]["name"]].append((f["rule"], f["message"]))
    return {name: unsatisfiable(fs) for name, fs in verdicts.items()}


@dataclass
class Judged:
    taint_rule_version: str | None
    inventory: Inventory
    admission: dict[str, list[str]]  # claim -> structure/unsatisfiable messages at admission
    review: dict[str, list[str]]  # the same from `draguard review`


@pytest.fixture(scope="module")
def judged(api: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Judged:
    with watched_view(api) as (cache, view):
        snap = Snapshot(
            policies=load_policies(ROOT / "policies"),
            inventory=view.inventory,
            namespace_labels=view.namespace_labels,
        )
        at_admission: dict[str, list[str]] = {}
        for obj, _ in CLAIMS:
            req = review(obj, group="resource.k8s.io", kind="ResourceClaim", namespace=NS)["request"]
            out = admission.review("validate", req, snap)
            at_admission[obj["metadata"]["name"]] = unsatisfiable([(f.rule, f.message) for f in out.findings])
        return Judged(
            getattr(cache, "taint_rule_version", None),
            view.inventory,
            at_admission,
            offline(tmp_path_factory.mktemp("review"), api),
        )


def test_the_watched_inventory_has_counters_taint_rules_and_node_labels(judged: Judged) -> None:
    assert judged.taint_rule_version == "v1"
    inv = judged.inventory
    assert inv.counter_sets == {("gpu.nvidia.com", "node-a", "gpu-0-counters"): {"memory": "80Gi"}}
    assert [r.name for r in inv.taint_rules] == ["drain-b-1"]
    assert {n: dict(labels) for n, labels in inv.node_labels.items()} == {
        n: {"rack": "r1"} for n in ("node-a", "node-b", "node-c")
    }


@pytest.mark.parametrize(("obj", "allocatable"), CLAIMS, ids=[c["metadata"]["name"] for c, _ in CLAIMS])
def test_admission_and_review_agree_on_the_claim(
    judged: Judged, obj: dict[str, Any], allocatable: bool
) -> None:
    name = obj["metadata"]["name"]
    messages = judged.admission[name]
    if allocatable:
        assert messages == []
    else:
        assert messages and all("cannot be allocated as a whole" in m for m in messages), messages
    assert judged.review[name] == messages


def test_node_heartbeats_do_not_rebuild_but_label_changes_do(api: ApiServer) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-h", "labels": {"zone": "z1"}}}
    api.request("POST", "/api/v1/nodes", node)
    with watched_view(api) as (cache, view):
        assert view.inventory.node_labels["node-h"] == {"zone": "z1"}
        # What the caches keep of a Node: its name and labels, nothing a kubelet reports.
        cached = cache.reflectors["nodes"].store[("", "node-h")]
        assert set(cached["metadata"]) == {"name", "labels", "resourceVersion"} and "spec" not in cached
        generation = cache.generation
        node = api.request("GET", "/api/v1/nodes/node-h")
        node["metadata"]["annotations"] = {"example.com/heartbeat": "1"}
        rv = api.request("PUT", "/api/v1/nodes/node-h", node)["metadata"]["resourceVersion"]
        wait(lambda: _stored_rv(cache, "node-h") == rv, what="the annotation update in the watch")
        assert cache.generation == generation, "a Node change the inventory does not read counted as one"
        node = api.request("GET", "/api/v1/nodes/node-h")
        node["metadata"]["labels"]["zone"] = "z2"
        api.request("PUT", "/api/v1/nodes/node-h", node)
        wait(lambda: cache.generation > generation, what="the label change to count as a change")


def _stored_rv(cache: ClusterCache, name: str) -> str | None:
    stored = cache.reflectors["nodes"].store.get(("", name))
    return None if stored is None else str(stored["metadata"].get("resourceVersion"))


def test_a_claim_admitted_before_the_watch_shows_it_keeps_the_137_facts(judged: Judged) -> None:
    """The per-identity view (claims admitted, not yet watched) is laid over the watched inventory:
    counters, DeviceTaintRules and node labels must survive it, or the next review would be judged
    without them."""
    held = claim("held", request("part", "part-mig"))
    entry = Entry("resourceclaims", (NS, "held"), held, "CREATE", "", "", time.monotonic() + 60)
    view = apply_overlay(
        CacheView(inventory=judged.inventory), {"resourceclaims": {(NS, "held"): entry}}, None, 1
    )
    inv = view.inventory
    assert (NS, "held") in inv.claims
    assert inv.counter_sets and inv.taint_rules and inv.node_labels
    assert inv.counter_sets == judged.inventory.counter_sets
    assert inv.taint_rules == judged.inventory.taint_rules
    assert inv.node_labels == judged.inventory.node_labels
