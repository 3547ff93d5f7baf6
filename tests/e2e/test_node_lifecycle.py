"""Starting and stopping a real node next to the session's: a second run on the same machine gets its
own names and addresses, and a start that fails part-way leaves nothing behind.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from webhook.dev import containerd, kubelet, network
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
