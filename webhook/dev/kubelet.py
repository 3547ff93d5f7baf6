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

from .apiserver import server_url
from .containerd import ContainerdPaths, runtime_dir
from .kube import Kube
from .network import NodeNet
from .node import NodeBins, NodeFiles, RealNode
from .procs import ClusterError, Supervisor, run

CGROUP_FS = Path("/sys/fs/cgroup")
FIXED_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
# Named hierarchies and the v2 mount are not controllers the kubelet's cgroupfs driver writes to.
SKIP_HIERARCHIES = {"unified"}


def root_dir(net: NodeNet) -> Path:
    """Short on purpose: the driver's per-pod sockets under it (`plugins_registry/<driver>-<pod
    UID>-reg.sock`) must fit a unix socket path's 107 bytes, which a deep state dir would not."""
    return runtime_dir(net) / "kubelet"


def plugin_dirs(net: NodeNet) -> tuple[Path, Path]:
    """(plugins, plugins_registry) of the kubelet: where a DRA driver puts its sockets."""
    return root_dir(net) / "plugins", root_dir(net) / "plugins_registry"


def device_plugin_dir(net: NodeNet) -> Path:
    """Where the node's kubelet serves kubelet.sock for device plugins (its own, per node)."""
    return root_dir(net) / "device-plugins"


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


def config(
    sup: Supervisor, net: NodeNet, cp: ContainerdPaths, files: NodeFiles | None = None
) -> dict[str, Any]:
    c = sup.paths.certs
    files = files or NodeFiles(sup.paths.node)
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
        "tlsCertFile": str(c / f"{files.certs}-serving.crt"),
        "tlsPrivateKeyFile": str(c / f"{files.certs}-serving.key"),
        # This machine has cgroup v1, which the kubelet refuses unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{cgroup_name(net)}",
        "containerRuntimeEndpoint": f"unix://{cp.socket}",
        "failSwapOn": False,
        "podLogsDir": str(files.dir / "pod-logs"),
        # No cluster DNS and an empty resolv.conf: a pod has no name server to send queries to.
        "resolvConf": str(files.dir / "resolv.conf"),
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
    sup: Supervisor,
    net: NodeNet,
    bins: NodeBins,
    cp: ContainerdPaths,
    node: RealNode,
    timeout: float,
    files: NodeFiles | None = None,
) -> None:
    """Start the kubelet and wait until its node is Ready and untainted by the node controller.

    Device plugins register with this kubelet at `device_plugin_dir(net)`, never in the machine-wide
    /var/lib/kubelet/device-plugins (which it does not see): a kubelet empties that directory when
    it starts and keeps its checkpoint there, so two kubelets sharing it would break each other.
    """
    files = files or NodeFiles(sup.paths.node)
    root = root_dir(net)
    root.mkdir(parents=True, exist_ok=True)
    # A shared mount of its own: the driver's plugin directory is mounted Bidirectional, which needs
    # shared propagation, and this machine's / is private. Tear-down unmounts it with the rest.
    if not _is_mount_point(root):
        run(["mount", "--bind", str(root), str(root)])
        run(["mount", "--make-rshared", str(root)])
    (files.dir / "pod-logs").mkdir(parents=True, exist_ok=True)
    (files.dir / "resolv.conf").write_text("# no name servers: dev-node pods resolve nothing\n")
    make_cgroup_root(net)
    cfg = files.dir / "kubelet-config.json"
    cfg.write_text(json.dumps(config(sup, net, cp, files), indent=2))
    labels = {
        "nvidia.com/gpu.present": "true",
        **({"draguard.io/real-node": "true"} if node.draguard else {}),
        **node.labels,
    }
    name = files.name("kubelet")
    path = f"{bins.bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    # The kubelet's device plugin socket is not under --root-dir: it is fixed at
    # /var/lib/kubelet/device-plugins/, where every kubelet on a machine would empty the others'.
    # This kubelet gets its own mount namespace with its root's directory bound there; the root
    # itself is a shared mount, so its volume mounts still reach containerd on the host.
    dp = device_plugin_dir(net)
    dp.mkdir(parents=True, exist_ok=True)
    FIXED_DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
    bind = 'mount --bind "$0" "$1" && shift && exec "$@"'
    wrap = ["unshare", "--mount", "--propagation", "unchanged", "--",
            "sh", "-c", bind, str(dp), str(FIXED_DEVICE_PLUGIN_DIR)]  # fmt: skip
    sup.spawn(
        name,
        [
            *wrap,
            str(bins.bin / "kubelet"),
            f"--config={cfg}",
            f"--kubeconfig={sup.paths.root / f'{files.certs}.kubeconfig'}",
            f"--root-dir={root}",
            f"--cert-dir={root / 'pki'}",
            f"--hostname-override={node.name}",
            f"--node-ip={net.node_ip}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
            *([f"--register-with-taints={','.join(node.taints)}"] if node.taints else []),
            "--v=2",
        ],
        env={"PATH": path},
        netns=net.netns,
    )
    c = sup.paths.certs
    kube = Kube(server_url(sup.state), c / "ca.crt", c / "admin.crt", c / "admin.key")

    def ready() -> bool:
        n = kube.get(f"/api/v1/nodes/{node.name}")
        conds = {x["type"]: x["status"] for x in n.get("status", {}).get("conditions") or []}
        taints = [
            t for t in n.get("spec", {}).get("taints") or [] if t["key"].startswith("node.kubernetes.io/")
        ]
        return conds.get("Ready") == "True" and not taints

    took = sup.wait(name, ready, timeout)
    sup.progress(f"kubelet: node {node.name} Ready on {net.node_ip} ({took:.1f}s)")
