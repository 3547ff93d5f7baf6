"""The driver's sharing modes on the real node (kubelet, containerd, CDI; simulated GPUs): shares of one
GPU by consumable capacity, and dynamic MIG partitions made at prepare and destroyed at unprepare.

Each class restarts the node's driver in its mode for its tests and gives the node back as it was
(its own GPUs, the default mode) once nothing is prepared any more. What a container sees is read
from inside it; what the driver holds from its checkpoint, its CDI specs and the simulated NVML's MIG
state file (the instances a real GPU would keep across a plugin restart).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.sim import MIG_STATE_ENV, load_topology  # MIG_STATE_ENV: where simulated GPUs keep instances
from driver.state import CRASH_ENV  # the plugin exits at once (like SIGKILL) at the named point
from tests.e2e.helpers import (
    Kubectl,
    allocated_devices,
    cdi_specs_for,
    claim_uid,
    exec_in,
    published_devices,
    running_pod,
    wait_for,
)
from webhook.dev import scenarios
from webhook.dev.cluster import LocalCluster

REPO = Path(__file__).parents[2]
SHARED_CLASS = "gpu.nvidia.com-a100-shared"
MIG_TOPOLOGY = "a100-2x-dynamic-mig.yaml"
PARTITION_CLASS = "gpu.nvidia.com-a100-mig-3g40gb"
WHOLE_PARTITION_CLASS = "gpu.nvidia.com-a100-mig-7g80gb"
GIB = 1 << 30

# What a share's container prints: the limits the CDI spec put in its environment, and its GPU.
SHOW_SHARE = (
    'echo "limit=$DRAGUARD_GPU_MEMORY_LIMIT"; echo "limits=$DRAGUARD_GPU_MEMORY_LIMITS"; '
    'echo "visible=$NVIDIA_VISIBLE_DEVICES"; exec sleep 3600'
)


# --- the node's driver ------------------------------------------------------------------------------
def _checkpoint(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """The driver's prepared (or half-prepared) claims by UID, as its checkpoint records them."""
    path = cluster.real_node_driver_dirs().plugins / "checkpoint.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return dict((doc.get("v2") or {}).get("preparedClaims") or {})


Devices = dict[str, dict[str, Any]]


def _restart_driver(
    cluster: LocalCluster, kubectl: Kubectl, node: str, published: Callable[[Devices], bool],
    what: str, *, topology: str | None = None, args: tuple[str, ...] = (), env: dict[str, str] | None = None,
) -> None:  # fmt: skip
    cluster.stop(f"driver-{node}")
    _start_driver(cluster, node, topology=topology, args=args, env=env)
    wait_for(lambda: published(published_devices(kubectl, node)), what, timeout=60)


def _start_driver(
    cluster: LocalCluster, node: str, *, topology: str | None = None, args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> None:  # fmt: skip
    """Start the node's driver; it returns once the kubelet has registered it."""
    assert node == cluster.state["real_node"]["name"]
    cluster.start_real_node_driver(topology=topology, args=args, env=env)


def _driver_down(cluster: LocalCluster, node: str) -> bool:
    return f"driver-{node}" not in cluster.running()


def _own_gpus(cluster: LocalCluster) -> set[str]:
    """The devices the node's driver publishes from the node's own topology in the default mode."""
    topology = REPO / "driver/sim/topologies" / str(cluster.state["real_node"]["topology"])
    return {f"gpu-{g.minor}" for g in load_topology(topology).gpus}


@pytest.fixture(scope="class")
def mode_restored(cluster: LocalCluster, kubectl: Kubectl, real_node: str) -> Iterator[list[str]]:
    """Yields a list the test class fills with the namespaces it made; afterwards they are emptied, the
    driver has unprepared everything, and it runs again on the node's own GPUs in the default mode."""
    made: list[str] = []
    yield made
    for ns in made:
        kubectl.run("delete", "pods", "--all", "-n", ns, "--wait=true", "--timeout=60s")
    if not _driver_down(cluster, real_node):
        wait_for(lambda: not _checkpoint(cluster), "every claim of the mode's tests unprepared", timeout=60)
    for ns in made:
        kubectl.run("delete", "namespace", ns, "--wait=false")
    own = _own_gpus(cluster)
    _restart_driver(
        cluster, kubectl, real_node,
        lambda devs: set(devs) == own and not any(d.get("allowMultipleAllocations") for d in devs.values()),
        "the node's own GPUs published again, unshared",
    )  # fmt: skip


# --- manifests ----------------------------------------------------------------------------------------
def _claim(ns: str, name: str, device_class: str, pci: str, memory: str | None = None) -> dict[str, Any]:
    """A claim for one device of `device_class` on the GPU at PCI address `pci` (`memory`: a share)."""
    exactly: dict[str, Any] = {
        "deviceClassName": device_class,
        # The GPU itself or a partition of it: both carry the GPU's PCI address.
        "selectors": [
            {"cel": {"expression": f"device.attributes['resource.kubernetes.io'].pciBusID == '{pci}'"}}
        ],
    }
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _apply_claim_pod(
    kubectl: Kubectl, ns: str, name: str, device_class: str, pci: str, image: str, node: str,
    memory: str | None = None, command: str = SHOW_SHARE,
) -> None:  # fmt: skip
    """Pod `name` with its own claim `<name>-gpu`, on `node`."""
    pod = scenarios.pod_manifest(ns, name, image, node=node, command=command,
                                 claim=("resourceClaimName", f"{name}-gpu"))  # fmt: skip
    docs = [_claim(ns, f"{name}-gpu", device_class, pci, memory), yaml.safe_load(pod)]
    applied = kubectl.apply(yaml.safe_dump_all(docs))
    assert applied.returncode == 0, applied.stderr


def _printed(kubectl: Kubectl, ns: str, pod: str) -> dict[str, str]:
    """The `key=value` lines the pod printed, once it has printed all three."""

    def check() -> dict[str, str] | None:
        lines = kubectl.ok("logs", "-n", ns, pod).splitlines()
        seen = dict(ln.split("=", 1) for ln in lines if "=" in ln)
        return seen if {"limit", "limits", "visible"} <= set(seen) else None

    return dict(wait_for(check, f"{ns}/{pod} to print what it sees", timeout=30))


def _result(kubectl: Kubectl, ns: str, claim: str) -> dict[str, Any]:
    [result] = kubectl.get("resourceclaim", claim, ns)["status"]["allocation"]["devices"]["results"]
    return dict(result)


def _delete_pod_and_claim(kubectl: Kubectl, ns: str, pod: str, *, force: bool = False) -> None:
    now = ["--force", "--grace-period=0"] if force else []
    kubectl.ok("delete", "pod", "-n", ns, pod, *now, "--wait=true", "--timeout=60s")
    kubectl.ok("delete", "resourceclaim", "-n", ns, f"{pod}-gpu", "--wait=true", "--timeout=60s")


# --- sharing by consumable capacity -------------------------------------------------------------------
@pytest.fixture(scope="class")
def shared_gpu(
    cluster: LocalCluster, kubectl: Kubectl, real_node: str, mode_restored: list[str]
) -> Iterator[tuple[str, str, str]]:
    """The node's driver sharing all its GPUs; yields (namespace, device, PCI address) of gpu-0,
    the GPU the class's claims are pinned to."""
    classes = (REPO / "kustomize/components/gpu-sharing/deviceclasses.yaml").read_text()
    [shared] = [d for d in yaml.safe_load_all(classes) if d and d["metadata"]["name"] == SHARED_CLASS]
    kubectl.ok("apply", "-f", "-", input=json.dumps(shared))
    own = _own_gpus(cluster)
    _restart_driver(
        cluster, kubectl, real_node,
        lambda devs: set(devs) == own and all(d.get("allowMultipleAllocations") for d in devs.values()),
        "the node's GPUs published for sharing", args=("--share-by-capacity", "all"),
    )  # fmt: skip
    gpu = published_devices(kubectl, real_node)["gpu-0"]
    policy = gpu["capacity"]["memory"]["requestPolicy"]
    assert policy["validRange"] == {"min": "1Gi", "max": "80Gi", "step": "1Gi"}, gpu
    ns = f"share-{uuid.uuid4().hex[:6]}"
    kubectl.ok("create", "namespace", ns)
    cluster.wait_default_sa(ns)
    mode_restored.append(ns)
    try:
        yield ns, "gpu-0", gpu["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
    finally:
        kubectl.run("delete", "deviceclass", SHARED_CLASS)


class TestShareByCapacity:
    def test_two_pods_share_one_gpu_each_sees_its_limit_and_one_leaving_keeps_the_other(
        self, cluster: LocalCluster, kubectl: Kubectl, real_node: str, workload_image: str,
        shared_gpu: tuple[str, str, str],
    ) -> None:  # fmt: skip
        ns, device, pci = shared_gpu
        for name, memory in (("big", "20Gi"), ("small", "1.5Gi")):
            _apply_claim_pod(kubectl, ns, name, SHARED_CLASS, pci, workload_image, real_node, memory)
        big, small = running_pod(kubectl, ns, "big"), running_pod(kubectl, ns, "small")
        # Both at once on one GPU, each with its own share; the scheduler rounds 1.5Gi up to the step.
        results = {n: _result(kubectl, ns, f"{n}-gpu") for n in ("big", "small")}
        assert {r["device"] for r in results.values()} == {device}, results
        assert results["big"]["shareID"] != results["small"]["shareID"], results
        assert results["big"]["consumedCapacity"] == {"memory": "20Gi"}, results
        assert results["small"]["consumedCapacity"] == {"memory": "2Gi"}, results
        assert {big["status"]["phase"], small["status"]["phase"]} == {"Running"}

        uuid = published_devices(kubectl, real_node)[device]["attributes"]["uuid"]["string"]
        seen = {n: _printed(kubectl, ns, n) for n in ("big", "small")}
        for name, limit in (("big", 20 * GIB), ("small", 2 * GIB)):
            assert seen[name] == {"limit": str(limit), "limits": f"{uuid}={limit}", "visible": uuid}, seen
        uids = {n: claim_uid(kubectl, ns, f"{n}-gpu") for n in ("big", "small")}
        held = _checkpoint(cluster)
        for name, limit in (("big", 20 * GIB), ("small", 2 * GIB)):
            [prepared] = held[uids[name]]["preparedDevices"]
            assert prepared["shareID"] == results[name]["shareID"], prepared
            assert prepared["consumedCapacity"] == {"memory": str(limit)}, prepared
            assert len(cdi_specs_for(cluster, uids[name])) == 1

        # One leaves: its share is unprepared, the other's stays prepared and its container runs on.
        kubectl.ok("delete", "pod", "-n", ns, "big", "--wait=true", "--timeout=60s")
        wait_for(lambda: uids["big"] not in _checkpoint(cluster) and not cdi_specs_for(cluster, uids["big"]),
                 "the leaving pod's share unprepared (checkpoint and CDI spec)")  # fmt: skip
        assert _checkpoint(cluster)[uids["small"]]["checkpointState"] == "PrepareCompleted"
        assert len(cdi_specs_for(cluster, uids["small"])) == 1
        still = kubectl.get("pod", "small", ns)
        assert still["status"]["phase"] == "Running" and still["metadata"]["uid"] == small["metadata"]["uid"]
        assert still["status"]["containerStatuses"][0]["restartCount"] == 0
        assert exec_in(kubectl, ns, "small", 'echo "$DRAGUARD_GPU_MEMORY_LIMIT"').strip() == str(2 * GIB)
        kubectl.ok("delete", "pod", "-n", ns, "small", "--wait=true", "--timeout=60s")
        for name in ("big", "small"):
            kubectl.ok("delete", "resourceclaim", "-n", ns, f"{name}-gpu", "--wait=true", "--timeout=60s")
        wait_for(lambda: not _checkpoint(cluster), "both shares unprepared")

    def test_plugin_killed_mid_prepare_of_a_share_leaves_nothing_and_the_other_share_stays(
        self, cluster: LocalCluster, kubectl: Kubectl, real_node: str, workload_image: str,
        shared_gpu: tuple[str, str, str],
    ) -> None:  # fmt: skip
        ns, device, pci = shared_gpu
        _apply_claim_pod(kubectl, ns, "kept", SHARED_CLASS, pci, workload_image, real_node, "20Gi")
        kept = running_pod(kubectl, ns, "kept")
        kept_uid = claim_uid(kubectl, ns, "kept-gpu")
        # The plugin now dies right after it has written the next share's CDI spec, before the
        # checkpoint says the share is prepared.
        _restart_driver(
            cluster, kubectl, real_node, lambda devs: bool(devs[device].get("allowMultipleAllocations")),
            "the GPUs still published for sharing",
            args=("--share-by-capacity", "all"), env={CRASH_ENV: "after-cdi-written"},
        )  # fmt: skip
        _apply_claim_pod(kubectl, ns, "victim", SHARED_CLASS, pci, workload_image, real_node, "10Gi")
        wait_for(lambda: _driver_down(cluster, real_node), "the plugin killed while preparing the share")
        victim_uid = claim_uid(kubectl, ns, "victim-gpu")
        assert _checkpoint(cluster)[victim_uid]["checkpointState"] == "PrepareStarted"
        assert len(cdi_specs_for(cluster, victim_uid)) == 1
        _delete_pod_and_claim(kubectl, ns, "victim", force=True)

        _start_driver(cluster, real_node, args=("--share-by-capacity", "all"))
        wait_for(lambda: victim_uid not in _checkpoint(cluster) and not cdi_specs_for(cluster, victim_uid),
                 "the deleted claim's half-prepared share gone after the restart", timeout=60)  # fmt: skip
        assert list(_checkpoint(cluster)) == [kept_uid]
        assert _checkpoint(cluster)[kept_uid]["checkpointState"] == "PrepareCompleted"
        assert len(cdi_specs_for(cluster, kept_uid)) == 1
        now = kubectl.get("pod", "kept", ns)
        assert now["metadata"]["uid"] == kept["metadata"]["uid"] and now["status"]["phase"] == "Running"
        assert now["status"]["containerStatuses"][0]["restartCount"] == 0
        # The rest of the GPU is free again for the driver too: a share of all of it beside the kept
        # one is prepared only if the killed share's memory is no longer counted.
        _apply_claim_pod(kubectl, ns, "rest", SHARED_CLASS, pci, workload_image, real_node, "60Gi")
        running_pod(kubectl, ns, "rest")
        assert _printed(kubectl, ns, "rest")["limit"] == str(60 * GIB)
        for pod in ("kept", "rest"):
            _delete_pod_and_claim(kubectl, ns, pod)
        wait_for(lambda: not _checkpoint(cluster), "every share unprepared")


# --- dynamic MIG --------------------------------------------------------------------------------------
def _instances(state: Path) -> list[dict[str, Any]]:
    """The MIG instances the simulated GPUs hold, from the state file the simulated NVML keeps."""
    try:
        doc = json.loads(state.read_text())
    except FileNotFoundError:
        return []
    return [dict(rec, gpu=gpu) for gpu, recs in doc.items() for rec in recs]


@pytest.fixture(scope="class")
def mig_node(
    cluster: LocalCluster, kubectl: Kubectl, real_node: str, mode_restored: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, Path, dict[str, str]]]:  # fmt: skip
    """The node's driver on two A100s in MIG mode with --dynamic-mig; yields (namespace, PCI address
    and UUID of gpu-0, the MIG state file, the driver's environment)."""
    state = tmp_path_factory.mktemp("mig") / "mig-state.json"
    env = {MIG_STATE_ENV: str(state)}
    _restart_driver(
        cluster, kubectl, real_node,
        lambda devs: "gpu-0" in devs and any(n.startswith("gpu-0-mig-3g40gb-") for n in devs),
        "the node's GPUs published as partitionable devices",
        topology=MIG_TOPOLOGY, args=("--dynamic-mig",), env=env,
    )  # fmt: skip
    gpu = published_devices(kubectl, real_node)["gpu-0"]
    ns = f"mig-{uuid.uuid4().hex[:6]}"
    kubectl.ok("create", "namespace", ns)
    cluster.wait_default_sa(ns)
    mode_restored.append(ns)
    # Whatever the tests leave is unprepared by this driver (mode_restored waits for it) before the
    # node's own driver comes back.
    yield ns, gpu["attributes"]["resource.kubernetes.io/pciBusID"]["string"], state, env


class TestDynamicMig:
    def test_a_partitions_instance_exists_only_while_its_pod_does(
        self, cluster: LocalCluster, kubectl: Kubectl, real_node: str, workload_image: str,
        mig_node: tuple[str, str, Path, dict[str, str]],
    ) -> None:  # fmt: skip
        ns, pci, state, _env = mig_node
        assert _instances(state) == []
        _apply_claim_pod(kubectl, ns, "part", PARTITION_CLASS, pci, workload_image, real_node)
        running_pod(kubectl, ns, "part")
        [device] = allocated_devices(kubectl, ns, "part-gpu")
        assert device.startswith("gpu-0-mig-3g40gb-"), device
        parent = published_devices(kubectl, real_node)["gpu-0"]["attributes"]["uuid"]["string"]
        [made] = _instances(state)
        start = int(device.rsplit("-", 1)[1])
        assert (made["gpu"], made["start"], made["profileId"]) == (parent, start, 9), made
        # The container's GPU is that instance (its UUID, made at prepare), and the claim says so.
        assert _printed(kubectl, ns, "part")["visible"] == made["uuid"]
        [status] = kubectl.get("resourceclaim", "part-gpu", ns)["status"]["devices"]
        assert made["uuid"] in json.dumps(status), status

        uid = claim_uid(kubectl, ns, "part-gpu")
        kubectl.ok("delete", "pod", "-n", ns, "part", "--wait=true", "--timeout=60s")
        wait_for(lambda: not _instances(state), "the partition's MIG instance destroyed after its pod")
        wait_for(lambda: uid not in _checkpoint(cluster) and not cdi_specs_for(cluster, uid),
                 "the partition unprepared (checkpoint and CDI spec)")  # fmt: skip
        kubectl.ok("delete", "resourceclaim", "-n", ns, "part-gpu", "--wait=true", "--timeout=60s")

    @pytest.mark.parametrize("first", ["whole", "part"])
    def test_a_whole_gpu_and_a_partition_of_it_never_run_together(
        self, cluster: LocalCluster, kubectl: Kubectl, real_node: str, workload_image: str,
        mig_node: tuple[str, str, Path, dict[str, str]], first: str,
    ) -> None:  # fmt: skip
        ns, pci, state, _env = mig_node
        # pod -> (class, the device it gets, the MIG profile id of the instance prepare makes for it);
        # the whole GPU is its whole-GPU instance (7g.80gb: MIG mode stays on).
        wants = {"whole": (scenarios.A100, "gpu-0", 0), "part": (PARTITION_CLASS, "gpu-0-mig-3g40gb-", 9)}
        [second] = [p for p in wants if p != first]
        _apply_claim_pod(kubectl, ns, first, wants[first][0], pci, workload_image, real_node)
        running_pod(kubectl, ns, first)
        assert allocated_devices(kubectl, ns, f"{first}-gpu")[0].startswith(wants[first][1])
        assert [i["profileId"] for i in _instances(state)] == [wants[first][2]]

        _apply_claim_pod(kubectl, ns, second, wants[second][0], pci, workload_image, real_node)

        def unschedulable() -> str | None:
            conds = kubectl.get("pod", second, ns)["status"].get("conditions") or []
            [c] = [c for c in conds if c["type"] == "PodScheduled"] or [{}]
            return str(c.get("message")) if c.get("reason") == "Unschedulable" else None

        why = wait_for(unschedulable, f"the {second} pod unschedulable while the {first} one holds the GPU")
        assert "claim" in why.lower(), why
        assert not kubectl.get("resourceclaim", f"{second}-gpu", ns).get("status", {}).get("allocation")
        assert kubectl.get("pod", first, ns)["status"]["phase"] == "Running"
        assert [i["profileId"] for i in _instances(state)] == [wants[first][2]]

        # The first released: only now is the second placed on the GPU, its instance made.
        _delete_pod_and_claim(kubectl, ns, first)
        running_pod(kubectl, ns, second)
        assert allocated_devices(kubectl, ns, f"{second}-gpu")[0].startswith(wants[second][1])
        assert [i["profileId"] for i in _instances(state)] == [wants[second][2]]
        _delete_pod_and_claim(kubectl, ns, second)
        wait_for(lambda: not _instances(state), "no MIG instance left")

    def test_plugin_killed_mid_prepare_of_a_partition_leaves_no_instance(
        self, cluster: LocalCluster, kubectl: Kubectl, real_node: str, workload_image: str,
        mig_node: tuple[str, str, Path, dict[str, str]],
    ) -> None:  # fmt: skip
        ns, pci, state, env = mig_node
        args = ("--dynamic-mig",)
        # The plugin now dies right after NVML has made the partition's instance, before its CDI spec.
        _restart_driver(cluster, kubectl, real_node, lambda devs: "gpu-0" in devs,
                        "the partitions still published", topology=MIG_TOPOLOGY, args=args,
                        env={**env, CRASH_ENV: "after-mig-created"})  # fmt: skip
        _apply_claim_pod(kubectl, ns, "victim", PARTITION_CLASS, pci, workload_image, real_node)
        wait_for(lambda: _driver_down(cluster, real_node), "the plugin killed while preparing the partition")
        uid = claim_uid(kubectl, ns, "victim-gpu")
        assert _checkpoint(cluster)[uid]["checkpointState"] == "PrepareStarted"
        [left] = _instances(state)
        assert left["profileId"] == 9, left
        _delete_pod_and_claim(kubectl, ns, "victim", force=True)

        _start_driver(cluster, real_node, topology=MIG_TOPOLOGY, args=args, env=env)
        wait_for(lambda: not _instances(state) and uid not in _checkpoint(cluster)
                 and not cdi_specs_for(cluster, uid),
                 "the deleted claim's instance destroyed and its entry gone after the restart")  # fmt: skip
        # NVML agrees: a partition covering every memory slice of that GPU can be made again.
        _apply_claim_pod(kubectl, ns, "after", WHOLE_PARTITION_CLASS, pci, workload_image, real_node)
        running_pod(kubectl, ns, "after")
        assert [(i["profileId"], i["start"]) for i in _instances(state)] == [(0, 0)]
        _delete_pod_and_claim(kubectl, ns, "after")
        wait_for(lambda: not _instances(state) and not _checkpoint(cluster), "nothing left prepared")
