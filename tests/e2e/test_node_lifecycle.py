"""Starting and stopping a real node next to the session's: a second run on the same machine gets its
own names and addresses, and a start that fails part-way leaves nothing behind; a node added to the
session's cluster (with the simulated device plugin) runs GPU pods and is removed without a trace.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.helpers import Kubectl, running_pod, wait_for
from webhook.dev import containerd, kubelet, network, realnodes, scenarios
from webhook.dev.cluster import ClusterError, LocalCluster, RealNode


def _routes() -> str:
    return subprocess.run(
        ["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True
    ).stdout


def test_failed_start_next_to_a_running_node_leaves_nothing(
    cluster: LocalCluster, real_node: str, tmp_path: Path
) -> None:
    first = cluster.net
    assert first is not None
    other = LocalCluster(tmp_path / "second", cluster.bin_dir, progress=lambda _m: None, tie_to_parent=True)
    missing = tmp_path / "no-such-image.oci.tar"
    with pytest.raises(ClusterError, match="no-such-image"):
        # Fails after its control plane, network and containerd are up: at the image import.
        other.up(real_node=RealNode(), images=[missing], sandbox_image="localhost/none:1", with_webhook=False)
    # What it was given: the same derivation, which skips the slot the session's node holds.
    second = network.allocate(other.paths.root)
    assert second.netns != first.netns and second.slot != first.slot
    assert other.running() == {}
    assert second.netns not in network._netns_list()
    assert not containerd.runtime_dir(second).exists()
    assert not containerd.leftover_shims(containerd.ContainerdPaths.of(other.paths.node, second))
    assert not list(Path("/sys/fs/cgroup/memory").glob(kubelet.cgroup_name(second)))
    assert f"{network.POD_NET}.{second.slot}.0/24" not in _routes()
    assert f"{network.SERVICE_NET}.{second.slot}.0/24" not in _routes()
    assert not containerd.mounts_under(other.paths.root)
    # The session's node was not touched.
    assert first.netns in network._netns_list() and cluster.is_up()
    assert f"{network.SERVICE_NET}.{first.slot}.0/24" in _routes()


def test_the_first_kubelet_serves_device_plugins_in_a_directory_of_its_own(
    cluster: LocalCluster, real_node: str
) -> None:
    """A kubelet empties /var/lib/kubelet/device-plugins when it starts and keeps its checkpoint
    there: the machine-wide directory would be shared with every other kubelet on the machine."""
    net = cluster.net
    assert net is not None
    pid = cluster.running()["kubelet"]
    own = kubelet.device_plugin_dir(net) / "kubelet.sock"
    wait_for(own.is_socket, "the kubelet's device-plugin socket in its own directory")
    assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    # What the kubelet sees at the fixed path is its own directory.
    inside = os.stat(f"/proc/{pid}/root{kubelet.FIXED_DEVICE_PLUGIN_DIR}/kubelet.sock")
    assert inside.st_ino == own.stat().st_ino
    host = kubelet.FIXED_DEVICE_PLUGIN_DIR / "kubelet.sock"
    assert not host.exists() or host.stat().st_ino != own.stat().st_ino


def test_an_added_device_plugin_node_runs_gpu_pods_and_goes_without_a_trace(
    cluster: LocalCluster, kubectl: Kubectl, real_node: str, workload_image: str, node_archives: list[Path]
) -> None:
    ns = f"lifecycle-{uuid.uuid4().hex[:6]}"
    kubectl.ok("create", "namespace", ns)
    cluster.wait_default_sa(ns)
    name = "gpu-legacy-9"
    try:
        # A pod on the first node, to show it is left alone.
        assert kubectl.apply(scenarios.shell_pod(ns, "first", workload_image, real_node)).returncode == 0
        first = running_pod(kubectl, ns, "first")
        t0 = time.monotonic()
        added = cluster.add_node(name, images=node_archives)
        took_add = time.monotonic() - t0
        net, files = added.net, added.files
        assert added.gpus == 4 and net.slot != cluster.net.slot  # type: ignore[union-attr]
        pod = scenarios.pod_manifest(ns, "legacy", workload_image, node=name, gpus=2,
                                     command='echo "$NVIDIA_VISIBLE_DEVICES"; exec sleep 3600')  # fmt: skip
        pod = pod.replace("spec:\n", f"spec:\n  tolerations: [{{key: {realnodes.DEVICE_PLUGIN_TAINT}, "
                          "operator: Exists}]\n", 1)  # fmt: skip
        assert kubectl.apply(pod).returncode == 0
        running_pod(kubectl, ns, "legacy", timeout=120)
        uuids = wait_for(lambda: kubectl.ok("logs", "-n", ns, "legacy").strip(), "legacy pod's GPUs")
        assert len(uuids.split(",")) == 2 and all(u.startswith("GPU-") for u in uuids.split(","))
        cp = containerd.ContainerdPaths.of(files.dir, net)
        assert containerd.leftover_shims(cp), "the pod's shim names this node's own containerd"
        assert net.netns in network._netns_list()

        t0 = time.monotonic()
        cluster.remove_node(name)
        took_remove = time.monotonic() - t0
        print(f"added in {took_add:.1f}s, removed in {took_remove:.1f}s")
        assert net.netns not in network._netns_list()
        assert not subprocess.run(["ip", "link", "show", net.host_if], capture_output=True).stdout
        assert f"{network.POD_NET}.{net.slot}.0/24" not in _routes()
        assert f"{network.SERVICE_NET}.{net.slot}.0/24" not in _routes()
        assert not containerd.leftover_shims(cp)
        assert not containerd.mounts_under(files.dir, containerd.runtime_dir(net))
        assert not containerd.runtime_dir(net).exists() and not files.dir.exists()
        assert not list(Path("/sys/fs/cgroup/memory").glob(kubelet.cgroup_name(net)))
        assert not list(Path("/var/lib/cni/results").glob(f"{net.cni_network}-*"))
        assert not [n for n in cluster.running() if n.endswith(f"-{name}")]
        assert kubectl.run("get", "node", name).returncode != 0
        assert kubectl.run("get", "pod", "legacy", "-n", ns).returncode != 0
        # The first node and its pod are as they were.
        now = kubectl.get("pod", "first", ns)
        assert now["status"]["phase"] == "Running" and now["metadata"]["uid"] == first["metadata"]["uid"]
        assert now["status"]["containerStatuses"][0]["restartCount"] == 0
        assert cluster.is_up() and cluster.net is not None and cluster.net.netns in network._netns_list()
    finally:
        if name in realnodes.names(cluster):
            cluster.remove_node(name)
        kubectl.run("delete", "namespace", ns, "--wait=false")
