"""The real node's parts that can be checked without binaries or root: names and addresses per state
directory, the safety-relevant settings of the CNI, containerd and kubelet configurations, and the
simulated driver root. Not marked e2e (see conftest): these run in every test run.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from webhook.dev import containerd, kubelet, network
from webhook.dev.node import NodeBins, NodeFiles
from webhook.dev.procs import Supervisor


def test_two_state_dirs_get_distinct_names_within_interface_limits(tmp_path: Path) -> None:
    a, b = (network.run_id_for(tmp_path / n) for n in ("one", "two"))
    assert a != b
    na, nb = network.NodeNet.for_slot(a, 7), network.NodeNet.for_slot(b, 8)
    assert len({na.netns, nb.netns}) == 2 and len({na.host_if, nb.host_if}) == 2
    for n in (na, nb):
        assert len(n.host_if) <= 15 and len(n.node_if) <= 15  # IFNAMSIZ
        assert n.node_ip != n.host_ip and not n.node_ip.startswith("127.")
    assert na.pod_cidr != nb.pod_cidr and na.service_cidr != nb.service_cidr
    assert network.run_id_for(tmp_path / "one") == a  # stable: `down` finds what `up` made


def test_cni_network_masquerades_nothing_and_keeps_ipam_in_the_state_dir(tmp_path: Path) -> None:
    net = network.NodeNet.for_slot("0123abcd", 3)
    conf = network.cni_config(net, tmp_path / "ipam")
    bridge = conf["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": net.pod_cidr, "gateway": net.pod_gateway}]]
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "ipam")
    assert conf["name"] == net.cni_network


def test_containerd_config(tmp_path: Path) -> None:
    net = network.NodeNet.for_slot("0123abcd", 3)
    p = containerd.ContainerdPaths.of(tmp_path / "node", net)
    bins = NodeBins(tmp_path / "bin", tmp_path / "cni")
    cfg = tomllib.loads(containerd.config_toml(p, bins, "localhost/draguard/pause:1"))
    assert cfg["version"] == 4 and cfg["imports"] == []
    plugins = cfg["plugins"]
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cdi_spec_dirs"] == [str(tmp_path / "node" / "cdi")]
    assert runtime["netns_mounts_under_state_dir"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert runc == {"BinaryName": str(tmp_path / "bin" / "runc"), "SystemdCgroup": False}
    assert plugins["io.containerd.cri.v1.images"]["snapshotter"] == "overlayfs"
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "localhost/draguard/pause:1"
    assert plugins["io.containerd.server.v1.grpc"]["address"] == str(p.socket)
    assert len(str(p.socket)) < 100 and len(str(p.state / "s" / ("x" * 64))) < 108  # sun_path
    assert plugins["io.containerd.nri.v1.nri"]["disable"] is True


def test_kubelet_is_never_anonymous(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    net = network.NodeNet.for_slot("0123abcd", 3)
    cfg = kubelet.config(sup, net, containerd.ContainerdPaths.of(sup.paths.node, net))
    assert cfg["authentication"]["anonymous"] == {"enabled": False}
    assert cfg["authentication"]["webhook"] == {"enabled": True}
    assert cfg["authorization"] == {"mode": "Webhook"}
    assert cfg["readOnlyPort"] == 0
    assert cfg["address"] == net.node_ip
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["cgroupRoot"] == f"/draguard-{net.run_id}"


def test_an_added_node_shares_no_name_file_or_certificate_with_the_first(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    first_net, added_net = network.NodeNet.for_slot("0123abcd", 3), network.NodeNet.for_slot("4567ef01", 4)
    first = NodeFiles(sup.paths.node)
    added = NodeFiles(tmp_path / "nodes" / "gpu-legacy-0", tag="-gpu-legacy-0", certs="kubelet-gpu-legacy-0")
    assert {first.name(c) for c in ("kubelet", "containerd")}.isdisjoint(
        {added.name(c) for c in ("kubelet", "containerd")}
    )
    cps = [containerd.ContainerdPaths.of(f.dir, n) for f, n in ((first, first_net), (added, added_net))]
    for field in ("root", "state", "socket", "config", "cdi", "cni_conf", "cni_ipam"):
        assert getattr(cps[0], field) != getattr(cps[1], field), field
    a = kubelet.config(sup, first_net, cps[0], first)
    b = kubelet.config(sup, added_net, cps[1], added)
    assert a["tlsCertFile"].endswith("/kubelet-serving.crt")
    assert b["tlsCertFile"].endswith("/kubelet-gpu-legacy-0-serving.crt")
    for key in (
        "address",
        "podLogsDir",
        "resolvConf",
        "cgroupRoot",
        "containerRuntimeEndpoint",
        "tlsCertFile",
    ):
        assert a[key] != b[key], key
    assert kubelet.device_plugin_dir(added_net) != kubelet.device_plugin_dir(first_net)
    assert str(kubelet.device_plugin_dir(added_net)).startswith(str(containerd.runtime_dir(added_net)))
