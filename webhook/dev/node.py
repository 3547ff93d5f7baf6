"""What a real node needs before it starts: its binaries, images and a name.

Binaries come from scripts/build-node.sh (kubelet, kube-proxy, containerd, ctr, the runc shim, runc,
crictl in bin/, the CNI plugins in cni/); images from webhook.dev.image (built without a daemon).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procs import ClusterError

NODE_BINARIES = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr", "runc", "crictl")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")


@dataclass(frozen=True)
class NodeBins:
    bin: Path
    cni: Path


@dataclass(frozen=True)
class RealNode:
    """A node with a kubelet: its name, the simulated GPUs its driver publishes, its labels.

    `draguard`: the node carries `draguard.io/real-node=true`, which the bundle's pods (the DRA
    driver's DaemonSet among them) are pinned to; a device-plugin node does not. `taints` are
    registered by the kubelet (`key=value:Effect`).
    """

    name: str = "gpu-a100-0"
    topology: str = "a100-4x-nvlink.yaml"
    labels: dict[str, str] = field(default_factory=lambda: {"draguard.io/gpu-product": "a100"})
    draguard: bool = True
    taints: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeFiles:
    """Where one real node keeps its files and what its processes are called.

    The cluster's first real node uses `<state>/node` and plain names; a node added later
    (webhook/dev/realnodes.py) its own directory, a `-<node>` suffix on every component and its own
    kubelet certificates, so two nodes share no containerd, kubelet root, socket or log.
    """

    dir: Path
    tag: str = ""
    certs: str = "kubelet"  # certs/<certs>.crt (client), certs/<certs>-serving.crt

    def name(self, component: str) -> str:
        return component + self.tag


def default_node_cache() -> Path:
    env = os.environ.get("DRAGUARD_NODE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "draguard" / "node"


def _missing(d: Path) -> list[str]:
    miss = [b for b in NODE_BINARIES if not os.access(d / "bin" / b, os.X_OK)]
    miss += [f"cni/{p}" for p in CNI_PLUGINS if not os.access(d / "cni" / p, os.X_OK)]
    return miss


def find_node_bins() -> NodeBins:
    """The node binaries: $DRAGUARD_NODE_DIR, or the newest scripts/build-node.sh build."""
    explicit = os.environ.get("DRAGUARD_NODE_DIR")
    if explicit:
        d = Path(explicit)
        if missing := _missing(d):
            raise ClusterError(
                f"{d}: missing {', '.join(missing)}; run scripts/build-node.sh or point "
                "DRAGUARD_NODE_DIR at its output (bin/ and cni/)"
            )
        return NodeBins(d / "bin", d / "cni")
    pinned: Path | None = None
    try:
        image: Any = importlib.import_module(".image", __package__)
    except ImportError:
        image = None
    if image is not None:
        # The build script's own key (its pinned versions).
        try:
            pinned = Path(image.find_node_dir())
        except (OSError, image.ImageError):
            pinned = None
    if pinned is not None and not _missing(pinned):
        return NodeBins(pinned / "bin", pinned / "cni")
    root = default_node_cache()
    # The newest build first: a changed pin builds into a new directory beside the old one.
    cands = sorted((p for p in root.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for d in cands:
        if not _missing(d):
            return NodeBins(d / "bin", d / "cni")
    raise ClusterError(
        f"no node binaries (kubelet, containerd, runc, CNI plugins) under {root}; build them with "
        "scripts/build-node.sh (make k8s builds them too) or set DRAGUARD_NODE_DIR"
    )


@dataclass(frozen=True)
class NodeImages:
    """OCI archives to import into the node's containerd and the names they carry."""

    archives: tuple[Path, ...]
    sandbox: str  # the pause image containerd uses for every pod sandbox
    workload: str  # the draguard image: Python, a shell and coreutils


def node_images(progress: Callable[[str], None] | None = None) -> NodeImages:
    """Build (or reuse) the pause and draguard images with webhook.dev.image (cached by its recipe)."""
    try:
        # Imported by name: the builder is an optional part of a checkout (it needs root and Debian).
        image: Any = importlib.import_module(".image", __package__)
    except ImportError:
        raise ClusterError("webhook/dev/image.py (the daemonless image builder) is missing") from None
    say = progress or (lambda _m: None)
    try:
        pause = image.ensure_pause_image(say)
        app = image.ensure_image(say)
    except image.ImageError as exc:
        raise ClusterError(f"the node's images could not be built: {exc}") from None
    return NodeImages((pause.path, app.path), pause.name, app.name)


def real_node_prerequisites(progress: Callable[[str], None] | None = None) -> NodeImages:
    """Everything a real node needs that can be checked before start; its images, built if missing."""
    from . import network

    network.check_prerequisites()
    find_node_bins()
    return node_images(progress)
