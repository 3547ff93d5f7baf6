"""The real node's kubelet: cgroupfs on this machine's cgroup v1, certificates from the dev PKI,
webhook authentication and authorization (never anonymous), in the node's network namespace.

At start the kubelet rewrites three host sysctls to the values it wants (vm.overcommit_memory=1,
kernel.panic=10, kernel.panic_on_oops=1); docs/local-cluster.md says so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from webhook.dev.containerd import ContainerdPaths, runtime_dir
from webhook.dev.kube import Kube
from webhook.dev.network import NodeNet
from webhook.dev.node import NodeBins, RealNode
from webhook.dev.procs import ClusterError, Supervisor, run

CGROUP_FS = Path("/sys/fs/cgroup")
# Named hierarchies and the v2 mount are not controllers the kubelet's cgroupfs driver writes to.
SKIP_HIERARCHIES = {"unified"}


def root_dir(net: NodeNet) -> Path:
    """Short on purpose: the driver's per-pod sockets under it (`plugins_registry/<driver>-<pod
    UID>-reg.sock`) must fit a unix socket path's 107 bytes, which a deep state dir would not."""
    return runtime_dir(net) / "kubelet"


def plugin_dirs(net: NodeNet) -> tuple[Path, Path]:
    """(plugins, plugins_registry) of the kubelet: where a DRA driver puts its sockets."""
    return root_dir(net) / "plugins", root_dir(net) / "plugins_registry"


def cgroup_name(net: NodeNet) -> str:
    return f"draguard-{net.run_id}"


def _hierarchies() -> list[Path]:
    if not CGROUP_FS.is_dir():
        return []
    return [p for p in CGROUP_FS.iterdir() if p.is_dir() and p.name not in SKIP_HIERARCHIES]


def make_cgroup_root(net: NodeNet) -> None:
    """The run's own cgroup root in every v1 hierarchy, so two nodes never share kubepods."""
    if not (CGROUP_FS / "memory").is_dir():
        raise ClusterError(f"{CGROUP_FS}/memory missing: the kubelet needs the cgroup v1 controllers mounted")
    for h in _hierarchies():
        d = h / cgroup_name(net)
        d.mkdir(exist_ok=True)
        if h.name == "cpuset":
            # A v1 cpuset starts empty; a task cannot join it until cpus and mems are set.
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((h / f).read_text())


def remove_cgroup_root(net: NodeNet) -> list[str]:
    """rmdir the run's cgroups, leaves first (a cgroup dir can only go once it has no tasks)."""
    removed = []
    for h in _hierarchies():
        top = h / cgroup_name(net)
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in [*dirs, top]:
            try:
                d.rmdir()
            except OSError:
                continue
        if not top.exists():
            removed.append(str(top))
    return removed


def _is_mount_point(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def config(sup: Supervisor, net: NodeNet, cp: ContainerdPaths) -> dict[str, Any]:
    c = sup.paths.certs
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": net.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(c / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(c / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(c / "kubelet-serving.key"),
        # This machine has cgroup v1, which the kubelet refuses unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{cgroup_name(net)}",
        "containerRuntimeEndpoint": f"unix://{cp.socket}",
        "failSwapOn": False,
        "podLogsDir": str(sup.paths.node / "pod-logs"),
        # No cluster DNS and an empty resolv.conf: a pod has no name server to send queries to.
        "resolvConf": str(sup.paths.node / "resolv.conf"),
        "clusterDomain": "cluster.local",
        # A loaded 2-core dev machine must not evict the demo's pods or GC its imported images.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": 110,
        "nodeStatusUpdateFrequency": "5s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


def start(
    sup: Supervisor, net: NodeNet, bins: NodeBins, cp: ContainerdPaths, node: RealNode, timeout: float
) -> None:
    root = root_dir(net)
    root.mkdir(parents=True, exist_ok=True)
    # A shared mount of its own: the driver's plugin directory is mounted Bidirectional, which needs
    # shared propagation, and this machine's / is private. Tear-down unmounts it with the rest.
    if not _is_mount_point(root):
        run(["mount", "--bind", str(root), str(root)])
        run(["mount", "--make-rshared", str(root)])
    (sup.paths.node / "pod-logs").mkdir(parents=True, exist_ok=True)
    (sup.paths.node / "resolv.conf").write_text("# no name servers: dev-node pods resolve nothing\n")
    make_cgroup_root(net)
    cfg = sup.paths.node / "kubelet-config.json"
    cfg.write_text(json.dumps(config(sup, net, cp), indent=2))
    labels = {
        "nvidia.com/gpu.present": "true",
        "draguard.io/real-node": "true",
        **node.labels,
    }
    path = f"{bins.bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    sup.spawn(
        "kubelet",
        [
            str(bins.bin / "kubelet"),
            f"--config={cfg}",
            f"--kubeconfig={sup.paths.root / 'kubelet.kubeconfig'}",
            f"--root-dir={root}",
            f"--cert-dir={root / 'pki'}",
            f"--hostname-override={node.name}",
            f"--node-ip={net.node_ip}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
            "--v=2",
        ],
        env={"PATH": path},
        netns=net.netns,
    )
    c = sup.paths.certs
    server = f"https://{net.host_ip}:{sup.state['ports']['kube-apiserver']}"
    kube = Kube(server, c / "ca.crt", c / "admin.crt", c / "admin.key")

    def ready() -> bool:
        n = kube.get(f"/api/v1/nodes/{node.name}")
        conds = {x["type"]: x["status"] for x in n.get("status", {}).get("conditions") or []}
        taints = [
            t for t in n.get("spec", {}).get("taints") or [] if t["key"].startswith("node.kubernetes.io/")
        ]
        return conds.get("Ready") == "True" and not taints

    took = sup.wait("kubelet", ready, timeout)
    sup.progress(f"kubelet: node {node.name} Ready on {net.node_ip} ({took:.1f}s)")
