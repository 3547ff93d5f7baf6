"""What a GPU container gets on the real node through the driver's CDI specs, as containerd applies
them, and how GPU health (an XID, a GPU lost at run time) reaches the ResourceSlices, the device-taint
eviction controller and the pod's status through the real kubelet.

The simulation stops at the GPU: simulated NVML, mknod'ed device nodes and the simulated driver root
the driver lays out (real files; its `nvidia-smi` is a shell script that lists only the devices
whose nodes it finds). Everything between the claim and the container is the real thing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.sim import SimulatedNvml, load_topology
from tests.e2e.helpers import (
    Kubectl,
    allocated_devices,
    claim_uid,
    published_devices,
    running_pod,
    start_claim_pod,
    wait_for,
)
from webhook.dev import scenarios
from webhook.dev.cluster import LocalCluster

MIG_TOPOLOGY = "a100-4x-mig.yaml"
MIG_CLASS = "gpu.nvidia.com-a100-mig-3g20gb"
NVIDIA_MAJOR, UVM_MAJOR, CAPS_MAJOR = 195, 510, 511
TAINT_KEY = "gpu.nvidia.com/unhealthy"
TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}

# What the container prints: nvidia-smi from where the CDI spec mounts the driver's binaries, the
# libraries where CUDA images look for them, and every character device node it was given.
PROBE = (
    'echo "== smi"; /usr/local/nvidia/bin/nvidia-smi -L; echo "smi rc=$?"; '
    'echo "== lib64"; ls -1 /usr/local/nvidia/lib64; '
    'echo "== libcuda"; cat /usr/local/nvidia/lib64/libcuda.so.1; '
    'echo "== nodes"; for d in /dev/nvidia* /dev/nvidia-caps/*; do '
    '[ -c "$d" ] && stat -c "%n %t:%T" "$d"; done; '
    'echo "== end"; exec sleep 3600'
)


def _sections(kubectl: Kubectl, ns: str, pod: str) -> dict[str, list[str]]:
    """The probe's output by section, once it has all been printed."""

    def printed() -> str | None:
        out = kubectl.ok("logs", "-n", ns, pod)
        return out if "== end" in out else None

    out = str(wait_for(printed, f"{ns}/{pod} to print what it sees", timeout=30))
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if line.startswith("== "):
            current = sections.setdefault(line[3:], [])
        else:
            current.append(line)
    return sections


def _nodes(lines: list[str]) -> dict[str, tuple[int, int]]:
    """`stat -c '%n %t:%T'` lines -> {path: (major, minor)}."""
    out = {}
    for line in lines:
        path, numbers = line.rsplit(" ", 1)
        major, minor = numbers.split(":")
        out[path] = (int(major, 16), int(minor, 16))
    return out


def _topology(cluster: LocalCluster, name: str | None = None) -> SimulatedNvml:
    return load_topology(
        Path(__file__).parents[2] / "driver/sim/topologies" / (name or _node_topology(cluster))
    )


def _node_topology(cluster: LocalCluster) -> str:
    return str(cluster.state["real_node"]["topology"])


def _restart_driver(
    cluster: LocalCluster, kubectl: Kubectl, node: str, topology: str | None,
    published: Callable[[dict[str, dict[str, Any]]], bool], what: str,
) -> None:  # fmt: skip
    cluster.stop(f"driver-{node}")
    cluster.start_real_node_driver(topology=topology)
    wait_for(lambda: published(published_devices(kubectl, node)), what, timeout=60)


def _own_gpus_untainted(node_gpus: set[str]) -> Callable[[dict[str, dict[str, Any]]], bool]:
    return lambda devs: set(devs) == node_gpus and not any(d.get("taints") for d in devs.values())


@contextlib.contextmanager
def _driver_restored(cluster: LocalCluster, kubectl: Kubectl, node: str) -> Iterator[None]:
    """Afterwards: no pending simulated events, and the node's own driver and GPUs, all untainted."""
    own = {f"gpu-{g.minor}" for g in _topology(cluster).gpus}
    try:
        yield
    finally:
        cluster.nvml_events_path(node).write_text("")
        _restart_driver(cluster, kubectl, node, None, _own_gpus_untainted(own),
                        "the node's own GPUs published again, untainted")  # fmt: skip


def test_a_claims_container_runs_nvidia_smi_from_the_driver_root_and_finds_its_libraries(
    cluster: LocalCluster,
    kubectl: Kubectl,
    namespace: Callable[..., str],
    real_node: str,
    workload_image: str,
) -> None:
    ns = namespace("gpu-smi")
    start_claim_pod(kubectl, ns, "smi", scenarios.A100, 2, workload_image, real_node, PROBE)
    devices = allocated_devices(kubectl, ns, "smi-gpu")
    sim = _topology(cluster)
    by_minor = {g.minor: g for g in sim.gpus}
    gpus = [by_minor[int(d.removeprefix("gpu-"))] for d in devices]
    seen = _sections(kubectl, ns, "smi")

    # nvidia-smi, mounted from the driver root, runs and finds exactly the claim's two GPUs: the
    # others' device nodes are not in this container.
    listed = [f"GPU {g.index}: {g.name} (UUID: {g.uuid})" for g in sorted(gpus, key=lambda g: g.index)]
    assert seen["smi"] == [*listed, "smi rc=0"], seen
    # The driver's versioned libraries with their SONAME and development links, with the driver
    # root's content (the simulated library says what it is).
    v = sim.driver_version
    for stem in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        assert {f"{stem}.so", f"{stem}.so.1", f"{stem}.so.{v}"} <= set(seen["lib64"]), seen["lib64"]
    assert seen["libcuda"][0].startswith(f"simulated libcuda {v}"), seen["libcuda"]
    # Exactly its GPUs' nodes and the control nodes, each the character device it should be.
    expected = {f"/dev/nvidia{g.minor}": (NVIDIA_MAJOR, g.minor) for g in gpus}
    expected |= {"/dev/nvidiactl": (NVIDIA_MAJOR, 255), "/dev/nvidia-uvm": (UVM_MAJOR, 0)}
    assert _nodes(seen["nodes"]) == expected, seen["nodes"]


def test_a_mig_claims_container_gets_its_capability_device_nodes(
    cluster: LocalCluster,
    kubectl: Kubectl,
    namespace: Callable[..., str],
    real_node: str,
    workload_image: str,
) -> None:
    sim = _topology(cluster, MIG_TOPOLOGY)
    migs = {f"gpu-{g.minor}-mig-" for g in sim.gpus}
    ns = namespace("gpu-mig")
    with _driver_restored(cluster, kubectl, real_node):
        _restart_driver(
            cluster, kubectl, real_node, MIG_TOPOLOGY,
            lambda devs: bool(devs) and all(any(n.startswith(p) for p in migs) for n in devs),
            "the node's GPUs published as MIG devices",
        )  # fmt: skip
        try:
            start_claim_pod(kubectl, ns, "mig", MIG_CLASS, 1, workload_image, real_node, PROBE)
            [device] = allocated_devices(kubectl, ns, "mig-gpu")
            uuid = published_devices(kubectl, real_node)[device]["attributes"]["uuid"]["string"]
            [(gpu, mig)] = [(g, m) for g in sim.gpus for m in g.migs if m.uuid == uuid]
            seen = _sections(kubectl, ns, "mig")
        finally:
            kubectl.run("delete", "pod", "-n", ns, "mig", "--wait=true", "--timeout=60s")

    assert seen["smi"] == [f"  MIG {mig.profile} Device (UUID: {mig.uuid})", "smi rc=0"], seen
    # The capability nodes' minors are the ones the driver's /proc files give for this GPU
    # instance and compute instance (read on the host, in the simulated driver root).
    caps = cluster.real_node_driver_dirs().plugins / "sim-driver-root/proc/driver/nvidia/capabilities"
    gi_dir = caps / f"gpu{gpu.minor}/mig/gi{mig.gi_id}"
    minors = []
    for access in (gi_dir / "access", gi_dir / f"ci{mig.ci_id}" / "access"):
        [line] = [ln for ln in access.read_text().splitlines() if ln.startswith("DeviceFileMinor:")]
        minors.append(int(line.split(":")[1]))
    expected = {f"/dev/nvidia-caps/nvidia-cap{m}": (CAPS_MAJOR, m) for m in minors}
    expected |= {f"/dev/nvidia{gpu.minor}": (NVIDIA_MAJOR, gpu.minor)}
    expected |= {"/dev/nvidiactl": (NVIDIA_MAJOR, 255), "/dev/nvidia-uvm": (UVM_MAJOR, 0)}
    assert _nodes(seen["nodes"]) == expected, seen["nodes"]


def _allocated_status(kubectl: Kubectl, ns: str, pod: str) -> list[dict[str, Any]]:
    [container] = kubectl.get("pod", pod, ns)["status"].get("containerStatuses") or [{}]
    return list(container.get("allocatedResourcesStatus") or [])


def test_an_xid_taints_the_device_and_reaches_the_pods_status_through_the_kubelet(
    cluster: LocalCluster,
    kubectl: Kubectl,
    namespace: Callable[..., str],
    real_node: str,
    workload_image: str,
) -> None:
    ns = namespace("gpu-health")
    events = cluster.nvml_events_path(real_node)
    with _driver_restored(cluster, kubectl, real_node):
        start_claim_pod(kubectl, ns, "sick", scenarios.A100, 1, workload_image, real_node)
        [device] = allocated_devices(kubectl, ns, "sick-gpu")
        resource_id = f"k8s.gpu.nvidia.com/claim={claim_uid(kubectl, ns, 'sick-gpu')}-{device}"

        def reported(health: str, message: str | None) -> Callable[[], bool]:
            def check() -> bool:
                status = _allocated_status(kubectl, ns, "sick")
                if not status:
                    return False
                [entry] = status
                assert entry["name"] == "claim:gpu", status
                [res] = entry["resources"]
                assert res["resourceID"] == resource_id, status
                return bool(res["health"] == health and res.get("message") == message)

            return check

        # The kubelet's health stream from the driver is up: the device is reported healthy first.
        wait_for(reported("Healthy", None), "the pod's GPU reported Healthy by the kubelet", timeout=90)
        uuid = published_devices(kubectl, real_node)[device]["attributes"]["uuid"]["string"]
        with events.open("a") as f:  # row-remapping failure: no new work, running work may stay
            f.write(json.dumps({"uuid": uuid, "xid": 63}) + "\n")

        def tainted() -> list[dict[str, Any]] | None:
            return published_devices(kubectl, real_node)[device].get("taints") or None

        [taint] = wait_for(tainted, f"{device} tainted in the ResourceSlice", timeout=60)
        assert (taint["key"], taint["value"], taint["effect"]) == (TAINT_KEY, "xid-63", "NoSchedule")
        others = {n: d.get("taints") for n, d in published_devices(kubectl, real_node).items() if n != device}
        assert not any(others.values()), others
        wait_for(
            reported("Unhealthy", "xid-63 (NoSchedule)"),
            "the pod's GPU reported Unhealthy in its container status",
            timeout=90,
        )
        # NoSchedule: the running pod stays.
        assert kubectl.get("pod", "sick", ns)["status"]["phase"] == "Running"


def _tolerating_claim_pod(ns: str, name: str, image: str, node: str) -> str:
    """scenarios.claim_pod for one A100, its request tolerating the driver's health taints."""
    docs = list(yaml.safe_load_all(scenarios.claim_pod(ns, name, scenarios.A100, 1, image, node)))
    [claim] = [d for d in docs if d["kind"] == "ResourceClaim"]
    # The device-taint eviction controller honours only tolerations that name NoExecute; one
    # without an effect keeps the scheduler from refusing the device but not the pod from eviction.
    claim["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [TOLERATION]
    return yaml.safe_dump_all(docs)


def test_a_gpu_lost_at_run_time_is_tainted_its_pod_evicted_or_told_and_the_others_stay(
    cluster: LocalCluster,
    kubectl: Kubectl,
    namespace: Callable[..., str],
    real_node: str,
    workload_image: str,
) -> None:
    ns = namespace("gpu-lost")
    events = cluster.nvml_events_path(real_node)
    own = {f"gpu-{g.minor}" for g in _topology(cluster).gpus}
    with _driver_restored(cluster, kubectl, real_node):
        applied = kubectl.apply(_tolerating_claim_pod(ns, "kept", workload_image, real_node))
        assert applied.returncode == 0, applied.stderr
        running_pod(kubectl, ns, "kept")
        start_claim_pod(kubectl, ns, "evicted", scenarios.A100, 1, workload_image, real_node)
        [kept_dev] = allocated_devices(kubectl, ns, "kept-gpu")
        [evicted_dev] = allocated_devices(kubectl, ns, "evicted-gpu")
        kept_id = f"k8s.gpu.nvidia.com/claim={claim_uid(kubectl, ns, 'kept-gpu')}-{kept_dev}"

        def kept_health(health: str, message: str | None) -> Callable[[], bool]:
            def check() -> bool:
                proc = kubectl.run("get", "pod", "-n", ns, "kept")
                if "NotFound" in proc.stderr:
                    pytest.fail(f"pod {ns}/kept is gone: {kubectl.ok('get', 'events', '-n', ns)}")
                [entry] = _allocated_status(kubectl, ns, "kept") or [{}]
                [res] = entry.get("resources") or [{}]
                assert res.get("resourceID") in (None, kept_id), entry
                return bool(res.get("health") == health and res.get("message") == message)

            return check

        wait_for(kept_health("Healthy", None), "the kept pod's GPU reported Healthy", timeout=90)
        # The scheduler carries the request's toleration into the allocation, where the device-taint
        # eviction controller reads it.
        [result] = kubectl.get("resourceclaim", "kept-gpu", ns)["status"]["allocation"]["devices"]["results"]
        assert result.get("tolerations") == [TOLERATION], result
        devs = published_devices(kubectl, real_node)
        with events.open("a") as f:  # both GPUs fall off the bus
            for dev in (kept_dev, evicted_dev):
                f.write(json.dumps({"lost": devs[dev]["attributes"]["uuid"]["string"]}) + "\n")

        # The driver runs with its default 300 s inventory resync: the taints come from the health
        # watcher, within seconds.
        def lost_tainted() -> dict[str, Any] | None:
            now = published_devices(kubectl, real_node)
            return now if all(now[d].get("taints") for d in (kept_dev, evicted_dev)) else None

        now = wait_for(lost_tainted, f"{kept_dev} and {evicted_dev} tainted as lost", timeout=60)
        for dev in (kept_dev, evicted_dev):
            [taint] = now[dev]["taints"]
            assert (taint["key"], taint["value"], taint["effect"]) == (TAINT_KEY, "gpu-lost", "NoExecute")
        # The lost GPUs stay published (tainted); the node's other GPUs stay, untainted.
        assert set(now) == own, sorted(now)
        others = {n: d.get("taints") for n, d in now.items() if n not in (kept_dev, evicted_dev)}
        assert others and not any(others.values()), others

        # NoExecute: the pod that does not tolerate it is evicted by the device-taint controller ...
        def evicted() -> bool:
            proc = kubectl.run("get", "pod", "-n", ns, "evicted", "-o", "json")
            if proc.returncode != 0:
                return "NotFound" in proc.stderr
            return bool(json.loads(proc.stdout)["metadata"].get("deletionTimestamp"))

        wait_for(evicted, "the non-tolerating pod on the lost GPU evicted", timeout=90)
        # ... and the one that tolerates it stays, told by the kubelet that its GPU is lost.
        wait_for(
            kept_health("Unhealthy", "gpu-lost (NoExecute)"),
            "the kept pod's GPU reported Unhealthy (lost) in its container status",
            timeout=90,
        )
        assert kubectl.get("pod", "kept", ns)["status"]["phase"] == "Running"
