"""containerd for the real node: CRI with CDI, the overlayfs snapshotter, runc, the CNI bridge.

Root and CDI specs live under the state directory; sockets and runtime state under a short
/run/dg-<id>/ (unix socket paths are limited to 108 bytes). It runs in the node's network
namespace, so the CNI bridge and the pods' veths are made there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .network import NodeNet
from .node import NodeBins, NodeFiles
from .procs import ClusterError, Supervisor, run

NAMESPACE = "k8s.io"


@dataclass(frozen=True)
class ContainerdPaths:
    root: Path
    state: Path
    socket: Path
    config: Path
    cdi: Path
    cni_conf: Path
    cni_ipam: Path

    @classmethod
    def of(cls, node_dir: Path, net: NodeNet) -> ContainerdPaths:
        run_dir = runtime_dir(net)
        return cls(
            root=node_dir / "containerd",
            state=run_dir / "containerd",
            socket=run_dir / "containerd.sock",
            config=node_dir / "containerd.toml",
            cdi=node_dir / "cdi",
            cni_conf=node_dir / "cni" / "net.d",
            cni_ipam=node_dir / "cni" / "ipam",
        )


def runtime_dir(net: NodeNet) -> Path:
    """The node's sockets, runtime state and kubelet root: short, so socket paths stay under 108 bytes."""
    return Path("/run") / f"dg-{net.run_id}"


def config_toml(p: ContainerdPaths, bins: NodeBins, sandbox_image: str) -> str:
    def q(s: object) -> str:
        return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'

    return f"""\
# containerd of a draguard dev node (written by `draguard dev up`).
version = 4
root = {q(p.root)}
state = {q(p.state)}
# Nothing from the host's /etc/containerd.
imports = []

[plugins.'io.containerd.server.v1.grpc']
  address = {q(p.socket)}

[plugins.'io.containerd.server.v1.ttrpc']
  address = {q(str(p.socket) + ".ttrpc")}

[plugins.'io.containerd.shim.v1.manager']
  socket_dir = {q(p.state / "s")}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {q(sandbox_image)}

[plugins.'io.containerd.cri.v1.runtime']
  # CDI is always on in containerd 2; specs are read from the node's own directory.
  cdi_spec_dirs = [{q(p.cdi)}]
  # This machine lacks CAP_SYS_RESOURCE: runc may not lower a container's oom_score_adj below ours.
  restrict_oom_score_adj = true
  # Pod network namespaces under our state, not /run/netns, so tear-down finds exactly ours.
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = {q(bins.bin / "runc")}
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{q(bins.cni)}]
    conf_dir = {q(p.cni_conf)}
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.nri.v1.nri']
  # NRI's socket is host-wide; two dev nodes would fight over it.
  disable = true

[plugins.'io.containerd.internal.v1.opt']
  path = {q(p.root / "opt")}
"""


def ctr(bins: NodeBins, p: ContainerdPaths, *args: str, timeout: float = 300.0) -> str:
    return run([str(bins.bin / "ctr"), "--address", str(p.socket), "-n", NAMESPACE, *args], timeout=timeout)


def crictl(bins: NodeBins, p: ContainerdPaths, *args: str, check: bool = True, timeout: float = 60.0) -> str:
    endpoint = f"unix://{p.socket}"
    return run(
        [str(bins.bin / "crictl"), "--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
         "--timeout", "20s", *args],
        check=check, timeout=timeout,
    )  # fmt: skip


def start(
    sup: Supervisor,
    net: NodeNet,
    bins: NodeBins,
    sandbox_image: str,
    timeout: float,
    files: NodeFiles | None = None,
) -> ContainerdPaths:
    files = files or NodeFiles(sup.paths.node)
    p = ContainerdPaths.of(files.dir, net)
    for d in (p.root, p.state, p.cdi, p.cni_conf, p.cni_ipam):
        d.mkdir(parents=True, exist_ok=True)
    p.config.write_text(config_toml(p, bins, sandbox_image))
    path = f"{bins.bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    name = files.name("containerd")
    sup.spawn(
        name,
        [str(bins.bin / "containerd"), "--config", str(p.config), "--log-level", "info"],
        env={"PATH": path},
        netns=net.netns,
    )

    def ready() -> bool:
        return p.socket.is_socket() and "RuntimeReady" in crictl(bins, p, "info", check=False)

    took = sup.wait(name, ready, timeout)
    sup.progress(f"containerd ready on {p.socket} ({took:.1f}s)")
    return p


def import_image(bins: NodeBins, p: ContainerdPaths, archive: Path) -> str:
    """`ctr images import` an OCI archive into the CRI namespace; returns ctr's output."""
    if not archive.is_file():
        raise ClusterError(f"image archive {archive} is missing")
    return ctr(bins, p, "images", "import", str(archive))


def remove_all_pods(bins: NodeBins, p: ContainerdPaths) -> int:
    """Stop and remove every pod sandbox (CNI DEL, unmounts) while containerd still runs."""
    if not p.socket.is_socket():
        return 0
    ids = crictl(bins, p, "pods", "-q", check=False).split()
    for pod in ids:
        crictl(bins, p, "stopp", pod, check=False)
        crictl(bins, p, "rmp", "-f", pod, check=False)
    return len(ids)


def leftover_shims(p: ContainerdPaths) -> list[int]:
    """Shims of this containerd: their command line names its socket, which no other run shares."""
    needle = str(p.socket).encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmd and needle in cmd:
            pids.append(int(d.name))
    return pids


def kill_shims(p: ContainerdPaths) -> list[int]:
    pids = leftover_shims(p)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while leftover_shims(p) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


def mounts_under(*roots: Path) -> list[str]:
    """Mount points below `roots`, deepest first (from /proc/self/mountinfo)."""
    prefixes = [str(r.resolve()) + "/" for r in roots]
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        mp = line.split()[4].replace("\\040", " ")
        if any(mp.startswith(pre) or mp + "/" == pre for pre in prefixes):
            found.append(mp)
    return sorted(set(found), key=lambda m: m.count("/"), reverse=True)


def unmount_all(*roots: Path) -> list[str]:
    done = []
    for _ in range(3):  # a mount can hide another at the same point
        mps = mounts_under(*roots)
        if not mps:
            break
        for mp in mps:
            if subprocess.run(["umount", mp], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", mp], capture_output=True)
            done.append(mp)
    return done
