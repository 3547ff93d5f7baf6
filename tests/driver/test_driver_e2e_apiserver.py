"""The publisher and the claim reader against a real kube-apiserver (etcd + apiserver binaries)."""

from __future__ import annotations

import copy
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from driver_helpers import NODE, make_claim, make_state

from driver.devices import build_devices
from driver.nvml import open_sim
from driver.sharing import CapacitySharing
from driver.slices import SlicePublisher
from driver.state import ClaimRef, KubeClaimReader
from tests.apiserver import ApiServer, find_bin, start

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BIN = find_bin()


@pytest.fixture(scope="module")
def apiserver() -> Iterator[ApiServer]:
    if BIN is None:
        pytest.skip("kube-apiserver/etcd binaries not built (see DRAGUARD_K8S_BIN)")
    base = Path(tempfile.mkdtemp(prefix="dg-api-", dir="/tmp"))
    server = start(BIN, base)
    server.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def pool(server: ApiServer, version: str = "v1") -> list[dict]:
    items = server.request("GET", f"/apis/resource.k8s.io/{version}/resourceslices")["items"]
    return [s for s in items if s["spec"]["pool"]["name"] == NODE]


def publisher(server: ApiServer, **kw) -> SlicePublisher:
    return SlicePublisher.from_kubeconfig(str(server.kubeconfig), NODE, "gpu.nvidia.com", **kw)


def test_publish_update_and_shrink_pool(apiserver, tmp_path):
    pub = publisher(apiserver)
    assert pub.served_versions()[0] == "v1"
    h100 = build_devices(open_sim("h100-8x-nvlink").enumerate())
    r = pub.publish(h100)
    assert (r.version, r.generation, r.created, r.unchanged) == ("v1", 0, 1, False)
    (s,) = pool(apiserver)
    node_uid = apiserver.request("GET", f"/api/v1/nodes/{NODE}")["metadata"]["uid"]
    assert s["metadata"]["ownerReferences"][0]["uid"] == node_uid
    assert s["metadata"]["name"].startswith(f"{NODE}-gpu.nvidia.com-")
    dev = s["spec"]["devices"][0]
    assert dev["attributes"]["driverVersion"] == {"version": "550.54.15"}
    assert dev["capacity"]["memory"]["value"] == "81559Mi"
    # Same devices again: nothing written, generation kept.
    r = pub.publish(h100)
    assert r.unchanged and r.generation == 0
    # More than 128 devices: split into slices of one pool, generation bumped.
    big = build_devices(open_sim(_big(tmp_path)).enumerate())
    r = pub.publish(big)
    assert r.generation == 1 and not r.unchanged
    slices = pool(apiserver)
    assert sorted(len(x["spec"]["devices"]) for x in slices) == [12, 128]
    assert {x["spec"]["pool"]["generation"] for x in slices} == {1}
    assert {x["spec"]["pool"]["resourceSliceCount"] for x in slices} == {2}
    # Shrink back: the stale slice is deleted and the generation bumped again.
    r = pub.publish(h100)
    assert r.generation == 2 and r.deleted == 1
    (s,) = pool(apiserver)
    assert len(s["spec"]["devices"]) == 8 and s["spec"]["pool"]["generation"] == 2


def test_mig_and_mixed_slices_are_accepted(apiserver):
    for topo in ("a100-4x-mig", "mixed-nvlink-pairs", "a100-4x-nvlink"):
        devs = build_devices(open_sim(topo).enumerate())
        r = publisher(apiserver).publish(devs)
        assert not r.unchanged
        names = {d["name"] for s in pool(apiserver) for d in s["spec"]["devices"]}
        assert names == {d.name for d in devs}


def test_v1beta2_writer_is_accepted(apiserver):
    devs = build_devices(open_sim("a100-4x-mig").enumerate())
    r = publisher(apiserver, version="v1beta2").publish(devs)
    assert r.version == "v1beta2"
    (s,) = pool(apiserver)  # read back as v1: same devices
    assert s["spec"]["devices"][0]["attributes"]["profile"] == {"string": "3g.20gb"}


def test_prepare_reads_the_claim_from_the_api(apiserver, short_dir):
    ns = "ml-workloads"
    apiserver.request(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    )
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "training", "namespace": ns},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]
            }
        },
    }
    created = apiserver.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim)
    uid = created["metadata"]["uid"]
    reader = KubeClaimReader(publisher(apiserver).api, "v1")
    state = make_state(short_dir, reader)
    out = state.prepare(ClaimRef(ns, "training", uid))
    assert "not allocated" in out.error
    # Allocate it as the scheduler would (status subresource), then prepare succeeds.
    alloc = copy.deepcopy(created)
    alloc["status"] = make_claim("training", uid, [("gpu", "gpu-0"), ("gpu", "gpu-1")])["status"]
    apiserver.request(
        "PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/training/status", alloc
    )
    out = state.prepare(ClaimRef(ns, "training", uid))
    assert out.error == "" and [d.device_name for d in out.devices] == ["gpu-0", "gpu-1"]
    assert "UID" in state.prepare(ClaimRef(ns, "training", "other-uid")).error
    assert "not found" in state.prepare(ClaimRef(ns, "nope", "u")).error
    # The claim is deleted: restart recovery drops it and removes its CDI spec.
    apiserver.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/training")
    report = make_state(short_dir, reader).recover()
    assert report.dropped == [uid]
    assert not list((short_dir / "cdi").iterdir())


@pytest.mark.parametrize("version", ["v1", "v1beta2"])  # v1beta1 is no longer served by 1.37
def test_gpus_shared_by_capacity_are_accepted_and_read_back_unchanged(apiserver, version):
    node = open_sim("h100-8x-nvlink").enumerate()
    pub = publisher(apiserver, version=version)
    pub.publish(build_devices(node))  # the pool starts unshared: turning the setting on is a change
    devs = build_devices(node, sharing=CapacitySharing())
    assert not pub.publish(devs).unchanged
    (s,) = pool(apiserver)  # read back as v1
    dev = s["spec"]["devices"][0]
    assert dev["allowMultipleAllocations"] is True
    assert dev["capacity"]["memory"] == {
        "value": "81559Mi",
        "requestPolicy": {"default": "79Gi", "validRange": {"min": "1Gi", "max": "79Gi", "step": "1Gi"}},
    }
    assert pub.publish(devs).unchanged  # the server keeps the policy as written: no endless republish


def test_a_share_allocated_through_the_api_is_prepared_with_its_limit(apiserver, short_dir):
    ns = "shares"
    apiserver.request(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    )
    request = {"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": "20Gi"}}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "infer", "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }
    created = apiserver.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim)
    uid = created["metadata"]["uid"]
    share = str(uuid.uuid4())
    alloc = copy.deepcopy(created)
    alloc["status"] = make_claim("infer", uid, [("gpu", "gpu-7")])["status"]
    result = alloc["status"]["allocation"]["devices"]["results"][0]
    result.update(shareID=share, consumedCapacity={"memory": "20Gi"})
    apiserver.request("PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/infer/status", alloc)
    reader = KubeClaimReader(publisher(apiserver).api, "v1")
    state = make_state(short_dir, reader, sharing=CapacitySharing())
    out = state.prepare(ClaimRef(ns, "infer", uid))
    assert out.error == ""
    (dev,) = out.devices
    assert (dev.share_id, dev.consumed_memory) == (share, 20 << 30)
    assert dev.cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={uid}-gpu-7-{share}"]
    assert state.unprepare(ClaimRef(ns, "infer", uid)) == ""
    assert not list((short_dir / "cdi").iterdir())


def test_dynamic_mig_counters_and_partitions_are_accepted(apiserver):
    node = open_sim("a100-2x-dynamic-mig").enumerate()
    pub = publisher(apiserver, version="v1")
    devs = build_devices(node, dynamic_mig=True)
    assert not pub.publish(devs).unchanged
    slices = pool(apiserver)
    counters = [s for s in slices if s["spec"].get("sharedCounters")]
    (cs,) = counters  # counters in a slice of their own (Kubernetes 1.35+)
    assert "devices" not in cs["spec"] or not cs["spec"]["devices"]
    sets = {c["name"]: c["counters"] for c in cs["spec"]["sharedCounters"]}
    assert sorted(sets) == ["gpu-0-counter-set", "gpu-1-counter-set"]
    assert sets["gpu-0-counter-set"]["memory-slice-7"] == {"value": "1"}
    assert sets["gpu-0-counter-set"]["multiprocessors"] == {"value": "98"}
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    assert len(devices) == len(devs) == 2 * (1 + 7 + 7 + 4 + 3 + 2 + 1 + 1)
    part = devices["gpu-0-mig-3g40gb-9-4"]
    (use,) = part["consumesCounters"]
    assert use["counterSet"] == "gpu-0-counter-set"
    assert sorted(k for k in use["counters"] if k.startswith("memory-slice-")) == [
        f"memory-slice-{i}" for i in range(4, 8)
    ]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert pub.publish(devs).unchanged


def _big(tmp_path: Path) -> Path:
    from test_driver_slices import big_mig_topology

    return big_mig_topology(tmp_path / "big.yaml", 20)


async def test_driver_run_end_to_end(apiserver, short_dir):
    """`draguard driver run` as a process: publishes, registers, prepares an API claim, stops cleanly."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from driver_helpers import Kubelet

    from tests.apiserver import _free_port

    root = Path(__file__).resolve().parents[2]
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "DRAGUARD_NVML_SIM"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "driver.cli",
            "driver",
            "run",
            "--sim",
            "mixed-nvlink-pairs",
            "--node-name",
            NODE,
            "--kubeconfig",
            str(apiserver.kubeconfig),
            "--plugin-dir",
            str(short_dir / "plugins"),
            "--registry-dir",
            str(short_dir / "registry"),
            "--cdi-root",
            str(short_dir / "cdi"),
            "--metrics-port",
            str(port),
            "--pod-uid",
            "pod-1",
        ],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    reg = short_dir / "registry" / "gpu.nvidia.com-pod-1-reg.sock"
    try:
        deadline = time.monotonic() + 60
        while not reg.exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "plugin did not register in 60 s"
            time.sleep(0.2)
        while True:  # the slices are published in the background
            # A slice may be listed before its devices are (the API server omits an empty list).
            names = {d["name"] for s in pool(apiserver) for d in s["spec"].get("devices") or []}
            if names == {f"gpu-{i}" for i in range(5)}:
                break
            assert time.monotonic() < deadline, f"slices not published: {names}"
            time.sleep(0.2)
        ns = "e2e-run"
        apiserver.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "pair", "namespace": ns},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}
                    ]
                }
            },
        }
        created = apiserver.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim)
        created["status"] = make_claim(
            "pair", created["metadata"]["uid"], [("gpu", "gpu-2"), ("gpu", "gpu-3")]
        )["status"]
        apiserver.request(
            "PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/pair/status", created
        )
        kubelet = Kubelet(reg)
        info = await kubelet.register()
        assert info.endpoint.endswith("dra-pod-1.sock")
        resp = await kubelet.prepare(created)
        entry = resp.claims[created["metadata"]["uid"]]
        assert entry.error == "" and [d.device_name for d in entry.devices] == ["gpu-2", "gpu-3"]
        await kubelet.close()
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'dra_plugin_devices_published{type="gpu"} 5.0' in metrics
        assert 'dra_plugin_prepare_total{result="success"} 1.0' in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "SIMULATED NVML" in out
    assert not reg.exists() and not (short_dir / "plugins" / "dra-pod-1.sock").exists()


def _driver_client(server: ApiServer, node: str) -> Any:
    """The API client the driver's pod would have: its ServiceAccount, its token bound to `node`
    (impersonated here: no controller-manager mints pod-bound tokens on this bare API server)."""
    api = publisher(server).api
    api.set_default_header("Impersonate-User", "system:serviceaccount:draguard-driver:draguard-driver")
    api.set_default_header("Impersonate-Extra-authentication.kubernetes.io%2fnode-name", node)
    return api


def _put_compact(server: ApiServer, path: str, body: Any) -> None:
    """PUT as Go clients write (compact JSON): the API server compares each status entry's `data` byte
    for byte, so an entry written with spaces would differ from itself after any later patch."""
    import json
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(server.ca))
    ctx.load_cert_chain(str(server.cert), str(server.key))
    req = urllib.request.Request(server.url + path, data=json.dumps(body, separators=(",", ":")).encode(),
                                 method="PUT", headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
        assert resp.status == 200


def _get_raw(server: ApiServer, path: str) -> str:
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(server.ca))
    ctx.load_cert_chain(str(server.cert), str(server.key))
    with urllib.request.urlopen(urllib.request.Request(server.url + path), context=ctx, timeout=30) as resp:
        return str(resp.read().decode())


def _bundle_driver_rbac(server: ApiServer) -> None:
    import yaml

    rbac = Path(__file__).resolve().parents[2] / "kustomize" / "base" / "driver" / "rbac.yaml"
    for doc in yaml.safe_load_all(rbac.read_text()):
        kind = doc["kind"]
        path = f"/apis/rbac.authorization.k8s.io/v1/{kind.lower()}s"
        try:
            server.request("POST", path, doc)
        except Exception as exc:  # already there from an earlier test of this module
            assert "409" in str(exc) or "already exists" in str(exc), exc


def test_prepared_devices_show_in_the_claims_status_and_leave_with_unprepare(apiserver, short_dir):
    from driver.status import ClaimStatusWriter

    ns = "status-ns"
    apiserver.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": ns}})  # fmt: skip
    _bundle_driver_rbac(apiserver)
    base = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    claim = make_claim("shown", "x", [("gpu", "gpu-2")], namespace=ns)
    created = apiserver.request("POST", base, {k: claim[k] for k in ("apiVersion", "kind", "spec")}
                                | {"metadata": {"name": "shown", "namespace": ns}})  # fmt: skip
    uid = created["metadata"]["uid"]
    alloc = copy.deepcopy(created)
    alloc["status"] = claim["status"]
    # Another driver's device in the same claim, with its own status entry: never ours to touch.
    alloc["status"]["allocation"]["devices"]["results"].append(
        {"request": "gpu", "driver": "nic.example.com", "pool": NODE, "device": "nic-0"}
    )
    alloc["status"]["devices"] = [{"driver": "nic.example.com", "pool": NODE, "device": "nic-0",
                                   "data": {"mac": "02:00:00:00:00:01"}}]  # fmt: skip
    _put_compact(apiserver, f"{base}/shown/status", alloc)

    api = _driver_client(apiserver, NODE)
    writer = ClaimStatusWriter(api)
    writer.start()
    try:
        state = make_state(short_dir, KubeClaimReader(api, "v1"))
        state.status = writer
        out = state.prepare(ClaimRef(ns, "shown", uid))
        assert out.error == "", out.error
        assert writer.drain(30)
        entries = {e["driver"]: e for e in apiserver.request("GET", f"{base}/shown")["status"]["devices"]}
        ours = entries["gpu.nvidia.com"]
        assert (ours["pool"], ours["device"]) == (NODE, "gpu-2")
        (ready,) = ours["conditions"]
        assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
        assert ours["data"]["uuid"].startswith("GPU-")
        assert ours["data"]["cdiDeviceIDs"] == out.devices[0].cdi_device_ids
        assert "H100" in ours["data"]["productName"]
        assert entries["nic.example.com"]["data"] == {"mac": "02:00:00:00:00:01"}
        # Stored compact, as Go clients write: another driver's later patch must not see ours as changed.
        raw = _get_raw(apiserver, f"{base}/shown")
        assert '"data":{"' in raw and '"data": {' not in raw, raw

        assert state.unprepare(ClaimRef(ns, "shown", uid)) == ""
        assert writer.drain(30)
        left = apiserver.request("GET", f"{base}/shown")["status"]["devices"]
        assert [e["driver"] for e in left] == ["nic.example.com"]
        assert writer.failed == 0
    finally:
        writer.stop()

    # A driver on another node may not write this claim's status: prepare still succeeds, the status
    # write is refused by the API server and counted.
    other = ClaimStatusWriter(_driver_client(apiserver, "node-elsewhere"))
    other.start()
    try:
        state = make_state(short_dir / "other", KubeClaimReader(api, "v1"))
        state.status = other
        assert state.prepare(ClaimRef(ns, "shown", uid)).error == ""
        assert other.drain(30)
        assert other.failed == 1 and other.written == 0
        left = apiserver.request("GET", f"{base}/shown")["status"]["devices"]
        assert [e["driver"] for e in left] == ["nic.example.com"]
    finally:
        other.stop()
