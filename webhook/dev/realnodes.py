"""More real nodes on a running local cluster: add one, remove it, leave nothing behind.

An added node is built from the same parts as the cluster's first real node (network, containerd,
kubelet), each with this node's own names: its network namespace, link, pod range and cgroup root
(from its own slot), its own containerd (root, state, socket; two kubelets must never share one:
each garbage-collects the containers it does not know), its kubelet root under `/run/dg-<id>/`,
its kubelet certificates from the cluster CA, and a `-<node>` suffix on each process's name.

No kube-proxy: Services are the first node's business. The added node's namespace routes only its
link, its pods and the API server's address, so a pod there that dials a Service address gets
`Network is unreachable` on the spot, and its GPU pods need no Service.

With `device_plugin`, the node's GPUs come from the simulated NVIDIA device plugin
(driver/sim/deviceplugin.py) as `nvidia.com/gpu`, and draguard's DRA driver is not run there (it
would refuse the node anyway: its coexistence guard sees the `nvidia.com/gpu` capacity).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import PREFIX
from . import apiserver, containerd, kubelet, network, pki
from .kube import ApiError
from .node import NodeFiles, RealNode, node_images
from .procs import REPO_ROOT, ClusterError

if TYPE_CHECKING:
    from .cluster import LocalCluster

RESOURCE = "nvidia.com/gpu"
# Registered by the kubelet: only pods that say they want this node land there.
DEVICE_PLUGIN_TAINT = "draguard.io/device-plugin-node"
COMPONENTS = ("kubelet", "device-plugin", "containerd")


@dataclass(frozen=True)
class AddedNode:
    name: str
    net: network.NodeNet
    files: NodeFiles
    gpus: int
    took: float


def _files(cluster: LocalCluster, name: str) -> NodeFiles:
    return NodeFiles(cluster.paths.root / "nodes" / name, tag=f"-{name}", certs=f"kubelet-{name}")


def names(cluster: LocalCluster) -> list[str]:
    return sorted(cluster.state.get("extra_nodes") or {})


def gpu_product_label(topology: str) -> str:
    """`nvidia.com/gpu.product` as NVIDIA's GPU feature discovery writes it: the name, dashes for spaces."""
    from .._driver import module
    from .addons import topology_path

    load_topology = module("sim").load_topology

    sim = load_topology(topology_path(topology))
    return str(sim.gpus[0].name).replace(" ", "-") if sim.gpus else "unknown"


def add(
    cluster: LocalCluster,
    name: str,
    *,
    topology: str = "a100-4x-nvlink.yaml",
    device_plugin: bool = True,
    images: Sequence[Path] | None = None,
    timeout: float = 180.0,
) -> AddedNode:
    """Start one more real node `name` in the cluster; on failure everything it made is undone."""
    first = cluster.net
    address = cluster.state.get("apiserver_address")
    if first is None or not address or cluster.real_node is None:
        raise ClusterError(
            "adding a real node needs a cluster with a real node (dev up without --no-real-node)"
        )
    if name in names(cluster) or name in {n["name"] for n in cluster.state.get("nodes") or []}:
        raise ClusterError(f"node {name} is already part of this cluster")
    sandbox = (cluster.state.get("images") or {}).get("sandbox")
    if not sandbox:
        raise ClusterError("the cluster's state names no sandbox image; start it again with dev up")
    archives = list(images) if images is not None else list(node_images(cluster.progress).archives)
    t0 = time.monotonic()
    files = _files(cluster, name)
    net = network.allocate(files.dir)
    files.dir.mkdir(parents=True, exist_ok=True)
    cluster.state.setdefault("extra_nodes", {})[name] = {
        "net": net.to_state(),
        "dir": str(files.dir),
        "topology": topology,
        "device_plugin": device_plugin,
    }
    cluster._save_state()
    bins = cluster.node_bins()
    try:
        network.setup(net, apiserver=str(address))
        c = cluster.paths.certs
        pki.kubelet_certs(c, node_name=name, node_ip=net.node_ip, name=files.certs)
        apiserver.write_kubeconfig(
            c, cluster.paths.root / f"{files.certs}.kubeconfig", cluster.server, files.certs
        )
        cp = containerd.ContainerdPaths.of(files.dir, net)
        network.write_cni_config(net, cp.cni_conf, cp.cni_ipam)
        containerd.start(cluster, net, bins, sandbox, timeout, files)
        for archive in archives:
            containerd.import_image(bins, cp, archive)
        labels = {"draguard.io/device-plugin": "true"} if device_plugin else {}
        if device_plugin:
            labels["nvidia.com/gpu.product"] = gpu_product_label(topology)
        node = RealNode(
            name,
            topology,
            labels,
            draguard=False,
            taints=(f"{DEVICE_PLUGIN_TAINT}=true:NoSchedule",) if device_plugin else (),
        )
        kubelet.start(cluster, net, bins, cp, node, timeout, files)
        gpus = _start_device_plugin(cluster, name, net, files, topology, timeout) if device_plugin else 0
    except BaseException:
        cluster.progress(f"adding node {name} failed; logs kept in {cluster.paths.logs}")
        remove(cluster, name)
        raise
    took = time.monotonic() - t0
    cluster.progress(f"real node {name} added on {net.node_ip}, pods {net.pod_cidr} ({took:.1f}s)")
    return AddedNode(name, net, files, gpus, took)


def _start_device_plugin(
    cluster: LocalCluster, name: str, net: network.NodeNet, files: NodeFiles, topology: str, timeout: float
) -> int:
    """The simulated NVIDIA device plugin on the host, in the kubelet's device-plugins directory."""
    from .addons import topology_path

    component = files.name("device-plugin")
    cluster.spawn(
        component,
        [
            sys.executable, "-m", f"{PREFIX}driver.sim.deviceplugin",
            "--topology", str(topology_path(topology)),
            "--kubelet-dir", str(kubelet.device_plugin_dir(net)),
            "--driver-root", str(files.dir / "sim-driver-root"),
        ],
        env={"PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    kube = cluster.kube()
    want = gpu_count(topology)

    def advertised() -> bool:
        n = kube.get(f"/api/v1/nodes/{name}")
        return str((n.get("status", {}).get("allocatable") or {}).get(RESOURCE)) == str(want)

    took = cluster.wait(component, advertised, timeout)
    cluster.progress(f"device plugin: node {name} allocatable {RESOURCE}={want} ({took:.1f}s)")
    return want


def gpu_count(topology: str) -> int:
    from .._driver import module
    from .addons import topology_path

    load_topology = module("sim").load_topology

    return len(load_topology(topology_path(topology)).gpus)


def teardown_host(cluster: LocalCluster, net: network.NodeNet, node_dir: Path) -> list[str]:
    """Undo a real node's host changes once its processes are stopped: shims, mounts, namespace,
    routes, libcni's cache, cgroups and its runtime directory. Returns what went."""
    undone: list[str] = []
    cp = containerd.ContainerdPaths.of(node_dir, net)
    if shims := containerd.kill_shims(cp):
        undone.append(f"{len(shims)} leftover shims")
    run_dir = containerd.runtime_dir(net)
    if mounts := containerd.unmount_all(node_dir, run_dir):
        undone.append(f"{len(mounts)} mounts")
    undone += network.teardown(net)
    undone += [f"cni cache {p}" for p in network.remove_cni_cache(net)]
    undone += [f"cgroup {p}" for p in kubelet.remove_cgroup_root(net)]
    shutil.rmtree(run_dir, ignore_errors=True)
    return undone


def remove(cluster: LocalCluster, name: str) -> list[str]:
    """Stop node `name`'s processes, remove its pods' sandboxes and every host change, its files and
    its Node object. Safe to call on a half-added node."""
    entry: dict[str, Any] | None = (cluster.state.get("extra_nodes") or {}).get(name)
    if entry is None:
        raise ClusterError(
            f"no added node {name} in this cluster (added: {', '.join(names(cluster)) or 'none'})"
        )
    net = network.NodeNet.from_state(entry["net"])
    files = _files(cluster, name)
    done: list[str] = []
    for comp in ("kubelet", "device-plugin"):
        if cluster.stop(files.name(comp)):
            done.append(files.name(comp))
    cp = containerd.ContainerdPaths.of(files.dir, net)
    if files.name("containerd") in cluster.running():
        try:
            if n := containerd.remove_all_pods(cluster.node_bins(), cp):
                done.append(f"{n} pod sandboxes")
        except ClusterError as exc:
            cluster.progress(f"pods of {name} not removed through containerd: {exc}")
        cluster.stop(files.name("containerd"))
        done.append(files.name("containerd"))
    done += teardown_host(cluster, net, files.dir)
    shutil.rmtree(files.dir, ignore_errors=True)
    for suffix in (".crt", ".key", "-serving.crt", "-serving.key"):
        (cluster.paths.certs / f"{files.certs}{suffix}").unlink(missing_ok=True)
    (cluster.paths.root / f"{files.certs}.kubeconfig").unlink(missing_ok=True)
    if "kube-apiserver" in cluster.running():
        try:
            kube = cluster.kube()
            # Its pods are gone with their sandboxes; no kubelet is left to confirm that.
            pods = kube.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}").get("items") or []
            for pod in pods:
                meta = pod["metadata"]
                kube.delete(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}?gracePeriodSeconds=0"
                )
            kube.delete(f"/api/v1/nodes/{name}")
            done.append(f"Node {name}")
        except (ApiError, OSError) as exc:  # absent already, or the API server is going down
            cluster.progress(f"Node {name} not deleted: {exc}")
    cluster.state["extra_nodes"].pop(name, None)
    cluster._save_state()
    cluster.progress(f"removed node {name}: {', '.join(done)}")
    return done
