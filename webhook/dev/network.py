"""The real node's network: its own network namespace, a veth link to the host, the CNI bridge and
kube-proxy. Nothing is routed off the machine.

Layout (i = the run's slot, derived from the state directory):

    host                                  node namespace  draguard-<id>
    API server on 10.234.i.1 ── veth ──── 10.234.i.2  kubelet, containerd, kube-proxy
    10.235.i.0/24 via 10.234.i.2          cni0 10.235.i.1/24 ── pods (default route: cni0)
    unreachable 10.236.i.0/24             unreachable 10.236.i.0/24 (Service range), no default route

The node namespace has no default route, so a pod's packet to any address outside the link, the pod
range and the Service addresses kube-proxy translates fails right there. The Service range is
`unreachable` in both namespaces before kube-proxy writes a rule: an address with no Service gets an
ICMP error locally instead of following the host's default route. kube-proxy's chains live in the
node namespace, so two runs never share a chain, a bridge or an address.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .procs import ClusterError, Supervisor, run

SLOTS = 250
LINK_NET = "10.234"
POD_NET = "10.235"
SERVICE_NET = "10.236"
CNI_BRIDGE = "cni0"
REQUIRED_TOOLS = {"ip": "iproute2", "nsenter": "util-linux", "iptables": "iptables"}


@dataclass(frozen=True)
class NodeNet:
    """Names and addresses of one run's node network."""

    run_id: str
    slot: int
    netns: str
    host_if: str
    node_if: str
    host_ip: str
    node_ip: str
    pod_cidr: str
    pod_gateway: str
    service_cidr: str
    service_ip: str
    cni_network: str

    @classmethod
    def for_slot(cls, run_id: str, slot: int) -> NodeNet:
        return cls(
            run_id=run_id,
            slot=slot,
            netns=f"draguard-{run_id}",
            host_if=f"dgh{run_id[:8]}",
            node_if=f"dgn{run_id[:8]}",
            host_ip=f"{LINK_NET}.{slot}.1",
            node_ip=f"{LINK_NET}.{slot}.2",
            pod_cidr=f"{POD_NET}.{slot}.0/24",
            pod_gateway=f"{POD_NET}.{slot}.1",
            service_cidr=f"{SERVICE_NET}.{slot}.0/24",
            service_ip=f"{SERVICE_NET}.{slot}.1",
            cni_network=f"draguard-{run_id}",
        )

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> NodeNet:
        return cls(**data)

    def to_state(self) -> dict[str, Any]:
        return asdict(self)


def run_id_for(state_dir: Path) -> str:
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise ClusterError("a real node needs root (network namespaces, mounts, mknod, iptables)")
    missing = [f"{t} (Debian package {pkg})" for t, pkg in REQUIRED_TOOLS.items() if not shutil.which(t)]
    if missing:
        raise ClusterError(f"a real node needs {', '.join(missing)}; install with apt-get install")


def _used_prefixes() -> set[str]:
    out = run(["ip", "-j", "-4", "route", "show", "table", "all"], check=False) or "[]"
    nets: set[str] = set()
    for r in json.loads(out):
        dst = str(r.get("dst", ""))
        for prefix in (LINK_NET, POD_NET, SERVICE_NET):
            if dst.startswith(prefix + "."):
                nets.add(".".join(dst.split(".")[:3]))
    return nets


def allocate(state_dir: Path) -> NodeNet:
    """This run's slot: derived from the state directory, moved on when another run holds it."""
    run_id = run_id_for(state_dir)
    if f"draguard-{run_id}" in _netns_list():
        raise ClusterError(
            f"network namespace draguard-{run_id} of this state directory already exists; "
            f"run `draguard dev down --state-dir {state_dir}` first"
        )
    used = _used_prefixes()
    start = int(run_id, 16) % SLOTS
    for k in range(SLOTS):
        slot = 1 + (start + k) % SLOTS
        if not {f"{LINK_NET}.{slot}", f"{POD_NET}.{slot}", f"{SERVICE_NET}.{slot}"} & used:
            return NodeNet.for_slot(run_id, slot)
    raise ClusterError("no free address slot for a node network (10.234-236.x.0/24 all in use)")


def _netns_list() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def ns_run(net: NodeNet, *argv: str, check: bool = True) -> str:
    return run(["nsenter", f"--net=/run/netns/{net.netns}", "--", *argv], check=check)


def _ns_sysctl(net: NodeNet, key: str, value: str) -> None:
    path = "/proc/sys/" + key.replace(".", "/")
    # /proc/sys/net reflects the writer's network namespace.
    ns_run(net, "sh", "-c", f"echo {value} > {path}")


def setup(net: NodeNet, apiserver: str | None = None) -> None:
    """Create the namespace, the link and the routes (before any component starts).

    `apiserver`: the API server's address when it is on another node's link (a node added to a
    running cluster); the namespace gets a host route to it through this node's link, and still no
    default route.
    """
    run(["ip", "netns", "add", net.netns])
    run(["ip", "link", "add", net.host_if, "type", "veth", "peer", "name", net.node_if, "netns", net.netns])
    run(["ip", "addr", "add", f"{net.host_ip}/30", "dev", net.host_if])
    run(["ip", "link", "set", net.host_if, "up"])
    ns_run(net, "ip", "link", "set", "lo", "up")
    ns_run(net, "ip", "addr", "add", f"{net.node_ip}/30", "dev", net.node_if)
    ns_run(net, "ip", "link", "set", net.node_if, "up")
    # Pods reach the API server through the node namespace, which forwards between cni0 and the link.
    _ns_sysctl(net, "net.ipv4.ip_forward", "1")
    # Service traffic between pods on one bridge passes iptables (kube-proxy's DNAT) only with this.
    _ns_sysctl(net, "net.bridge.bridge-nf-call-iptables", "1")
    run(["ip", "route", "add", net.pod_cidr, "via", net.node_ip, "dev", net.host_if])
    run(["ip", "route", "add", "unreachable", net.service_cidr])
    ns_run(net, "ip", "route", "add", "unreachable", net.service_cidr)
    if apiserver is not None and apiserver != net.host_ip:
        # The host answers for all its addresses on any link: no forwarding is involved.
        ns_run(net, "ip", "route", "add", f"{apiserver}/32", "via", net.host_ip, "dev", net.node_if)


def teardown(net: NodeNet) -> list[str]:
    """Remove what setup and the node's components made; safe to call twice."""
    done = []
    if net.netns in _netns_list():
        # Deleting the namespace takes cni0, the link (both ends), the pods' host-side veths and
        # every iptables chain kube-proxy and portmap wrote there.
        run(["ip", "netns", "del", net.netns], check=False)
        done.append(f"netns {net.netns}")
    if run(["ip", "link", "show", net.host_if], check=False):
        run(["ip", "link", "del", net.host_if], check=False)
        done.append(f"link {net.host_if}")
    for route in (["unreachable", net.service_cidr], [net.pod_cidr]):
        if subprocess.run(["ip", "route", "del", *route], capture_output=True).returncode == 0:
            done.append(f"route {' '.join(route)}")
    return done


def cni_config(net: NodeNet, ipam_dir: Path) -> dict[str, Any]:
    """The node's CNI network: a bridge with host-local addresses, no masquerade."""
    return {
        "cniVersion": "1.0.0",
        "name": net.cni_network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": CNI_BRIDGE,
                "isGateway": True,
                # Nothing is masqueraded: pod traffic never leaves the machine, so it needs no NAT.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": net.pod_cidr, "gateway": net.pod_gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def write_cni_config(net: NodeNet, conf_dir: Path, ipam_dir: Path) -> None:
    conf_dir.mkdir(parents=True, exist_ok=True)
    ipam_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "10-draguard.conflist").write_text(json.dumps(cni_config(net, ipam_dir), indent=2))


def remove_cni_cache(net: NodeNet, cache_dir: Path = Path("/var/lib/cni")) -> list[str]:
    """libcni's result cache (always under /var/lib/cni): the entries of this run's network."""
    removed = []
    results = cache_dir / "results"
    if results.is_dir():
        for f in results.glob(f"{net.cni_network}-*"):
            f.unlink(missing_ok=True)
            removed.append(str(f))
    for sub in (results, cache_dir):
        with contextlib.suppress(OSError):
            sub.rmdir()  # only when nothing else uses it
    return removed


def start_kube_proxy(sup: Supervisor, net: NodeNet, node_bin: Path, node_name: str, timeout: float) -> None:
    """kube-proxy (iptables) in the node namespace; ready when it serves /healthz."""
    d = sup.paths.node / "kube-proxy"
    d.mkdir(parents=True, exist_ok=True)
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(sup.paths.root / "kube-proxy.kubeconfig")},
        "mode": "iptables",
        "hostnameOverride": node_name,
        "bindAddress": net.node_ip,
        "clusterCIDR": net.pod_cidr,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Host-wide conntrack limits and timeouts are left alone ("0" means: do not set).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": False},
        "nodePortAddresses": ["primary"],
    }
    cfg = d / "config.json"
    cfg.write_text(json.dumps(config, indent=2))
    sup.spawn(
        "kube-proxy",
        [str(node_bin / "kube-proxy"), f"--config={cfg}", "--v=1"],
        netns=net.netns,
    )

    took = sup.wait("kube-proxy", lambda: _proxy_synced(net), timeout)
    sup.progress(f"kube-proxy (iptables) programming Services in {net.netns} ({took:.1f}s)")


def _proxy_synced(net: NodeNet) -> bool:
    rules = ns_run(net, "iptables-save", "-t", "nat", check=False)
    return "-A KUBE-SERVICES" in rules and "default/kubernetes:https" in rules
