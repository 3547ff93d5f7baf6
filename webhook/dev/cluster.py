"""The local Kubernetes cluster: orchestrates the components, each in its own module.

Control plane (etcd, apiserver, controllers), simulated kubelet-less nodes (nodes), and optionally one
real node: its network (network), container runtime (containerd), kubelet (kubelet) and simulated GPUs
(gpu). Binaries come from `scripts/build-k8s.sh` and `scripts/build-node.sh`. State, certificates and
one log file per component live in a single state directory, so `down` can find and undo everything
it started.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import PREFIX
from . import addons, apiserver, containerd, controllers, etcd, kubelet, network, pki, realnodes
from .addons import FIELD_MANAGER, DriverDirs, generated_webhook_configs
from .kube import ApiError, Kube
from .node import NodeBins, RealNode, find_node_bins
from .nodes import SimNode, register_nodes
from .procs import (
    BINARIES,
    CONTROL_PLANE,
    REPO_ROOT,
    ClusterError,
    Paths,
    Progress,
    Supervisor,
    default_cache_dir,
    default_state_dir,
    find_bin_dir,
    free_port,
    pid_alive,
    port_open,
    proc_start_time,
    wait_until,
)

__all__ = [
    "BINARIES",
    "CONTROL_PLANE",
    "DEFAULT_NODES",
    "FIELD_MANAGER",
    "REPO_ROOT",
    "ClusterError",
    "LocalCluster",
    "Paths",
    "RealNode",
    "SimNode",
    "default_cache_dir",
    "default_state_dir",
    "find_bin_dir",
    "free_port",
    "generated_webhook_configs",
    "pid_alive",
    "port_open",
    "proc_start_time",
    "wait_until",
]

DEFAULT_NODES = (
    SimNode("gpu-a100-0", "a100-4x-nvlink.yaml", {"draguard.io/gpu-product": "a100"}),
    # A second NVLink A100 node: a 4-GPU training claim still fits while other pods hold A100s.
    SimNode("gpu-a100-1", "a100-4x-nvlink.yaml", {"draguard.io/gpu-product": "a100"}),
    SimNode("gpu-h100-0", "h100-8x-nvlink.yaml", {"draguard.io/gpu-product": "h100"}),
    SimNode("gpu-mig-0", "a100-4x-mig.yaml", {"draguard.io/gpu-product": "a100-mig"}),
)
# Components of the real node, stopped before the rest so pods are torn down while containerd runs.
NODE_FIRST = ("kubelet",)


class LocalCluster(Supervisor):
    """Start, inspect and stop the local cluster recorded in one state directory."""

    def __init__(
        self,
        state_dir: Path | None = None,
        bin_dir: Path | None = None,
        progress: Progress | None = None,
        *,
        tie_to_parent: bool = False,
    ) -> None:
        super().__init__(state_dir or default_state_dir(), progress, tie_to_parent=tie_to_parent)
        self._bin_dir = bin_dir

    # ---- where things are ----------------------------------------------------------------------
    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            saved = self.state.get("bin_dir")
            try:
                self._bin_dir = find_bin_dir(saved) if saved else find_bin_dir()
            except ClusterError:
                if not saved:
                    raise
                self._bin_dir = find_bin_dir()  # the recorded build is gone; use the current one
        return self._bin_dir

    @property
    def kubeconfig(self) -> Path:
        return self.paths.kubeconfig

    @property
    def server(self) -> str:
        return apiserver.server_url(self.state)

    @property
    def net(self) -> network.NodeNet | None:
        data = self.state.get("node_net")
        return network.NodeNet.from_state(data) if data else None

    @property
    def workload_image(self) -> str | None:
        """An image on the real node that has a shell, for pods that show what they see."""
        return (self.state.get("images") or {}).get("workload")

    @property
    def real_node(self) -> str | None:
        """The name of the node with a kubelet, if this cluster has one."""
        node = self.state.get("real_node")
        return str(node["name"]) if node else None

    def node_bins(self) -> NodeBins:
        saved = self.state.get("node_bins")
        if saved:
            return NodeBins(Path(saved["bin"]), Path(saved["cni"]))
        return find_node_bins()

    def containerd_paths(self) -> containerd.ContainerdPaths:
        net = self.net
        if net is None:
            raise ClusterError("this cluster has no real node")
        return containerd.ContainerdPaths.of(self.paths.node, net)

    def kube(self) -> Kube:
        c = self.paths.certs
        return Kube(self.server, c / "ca.crt", c / "admin.crt", c / "admin.key")

    def is_up(self) -> bool:
        alive = self.running()
        if not all(c in alive for c in CONTROL_PLANE):
            return False
        if self.real_node and not all(c in alive for c in ("containerd", "kubelet", "kube-proxy")):
            return False
        try:
            return bool(self.kube().get("/readyz") == "ok")
        except (ApiError, OSError, KeyError):
            return False

    # ---- start-up ------------------------------------------------------------------------------
    def up(
        self,
        nodes: Sequence[SimNode] = DEFAULT_NODES,
        *,
        real_node: RealNode | None = None,
        images: Sequence[Path] = (),
        sandbox_image: str | None = None,
        workload_image: str | None = None,
        with_driver: bool = True,
        with_webhook: bool = True,
        policies: Path | None = None,
        timeout: float = 180.0,
    ) -> None:
        """Start everything (or report that it already runs).  Raises ClusterError with the cause.

        With `real_node`, that node runs a kubelet, containerd and kube-proxy (root needed), and a
        simulated node of the same name in `nodes` is left out. `images` are OCI archives imported
        into its containerd; `sandbox_image` names the pause image among them and `workload_image`
        the one demo pods run (it needs a shell).
        """
        if self.is_up():
            self.progress(f"already up: kubeconfig {self.kubeconfig}")
            return
        if self.running() or self.state.get("node_net"):
            self.progress("cleaning up a half-started cluster")
            self.down()
        bin_dir = self.bin_dir
        bins = None
        if real_node is not None:
            network.check_prerequisites()
            bins = find_node_bins()
            if sandbox_image is None:
                raise ClusterError("a real node needs a sandbox (pause) image: pass sandbox_image and images")
        t_all = time.monotonic()
        self._reset_state_dir()
        self.state = {"bin_dir": str(bin_dir), "pids": {}, "order": [], "ports": {}}
        ports = self.state["ports"]
        for name in ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            ports[name] = free_port()
        sims = [n for n in nodes if real_node is None or n.name != real_node.name]
        self._save_state()
        try:
            net = None
            if real_node is not None and bins is not None:
                net = network.allocate(self.paths.root)
                self.state["node_net"] = net.to_state()
                self.state["real_node"] = {"name": real_node.name, "topology": real_node.topology}
                self.state["node_bins"] = {"bin": str(bins.bin), "cni": str(bins.cni)}
                self.state["images"] = {"sandbox": sandbox_image, "workload": workload_image}
                self.state["apiserver_address"] = net.host_ip
                self._save_state()
                network.setup(net)
                self.progress(
                    f"node network {net.netns}: node {net.node_ip}, pods {net.pod_cidr}, "
                    f"Services {net.service_cidr} (routed locally only)"
                )
            self._start_control_plane(bin_dir, timeout, net, real_node.name if real_node else None)
            kube = self.kube()
            t0 = time.monotonic()
            if sims:
                register_nodes(kube, sims)
                self._start_heartbeat(sims)
            self.state["nodes"] = [{"name": n.name, "topology": n.topology} for n in sims]
            if real_node is not None:
                self.state["nodes"].insert(0, {"name": real_node.name, "topology": real_node.topology})
            self._save_state()
            self.progress(f"{len(sims)} simulated GPU nodes Ready ({time.monotonic() - t0:.1f}s)")
            if real_node is not None and net is not None and bins is not None:
                assert sandbox_image is not None
                self._start_real_node(net, bins, real_node, images, sandbox_image, timeout)
            if with_driver:
                self.start_drivers(sims, timeout)
                if real_node is not None:
                    self.start_real_node_driver(timeout)
            if with_webhook:
                self.start_webhook(policies or REPO_ROOT / "policies", timeout)
        except BaseException:
            self.progress(f"start-up failed; logs kept in {self.paths.logs}")
            self.down(keep_logs=True)
            raise
        self.state["started"] = time.time()
        self._save_state()
        self.progress(f"cluster up in {time.monotonic() - t_all:.1f}s; export KUBECONFIG={self.kubeconfig}")

    def _start_control_plane(
        self, bin_dir: Path, timeout: float, net: network.NodeNet | None, node_name: str | None
    ) -> None:
        c = self.paths.certs
        t0 = time.monotonic()
        service_cidr = net.service_cidr if net else apiserver.DEFAULT_SERVICE_CIDR
        pki.cluster_certs(
            c,
            apiserver_address=net.host_ip if net else "127.0.0.1",
            service_ip=net.service_ip if net else "10.96.0.1",
        )
        if net is not None and node_name is not None:
            pki.node_certs(c, node_name=node_name, node_ip=net.node_ip)
        gates = apiserver.feature_gates(self, bin_dir)
        self.progress(
            f"certificates and keys written to {c} ({time.monotonic() - t0:.1f}s); "
            f"feature gates: {gates or '(DRA gates GA and locked on)'}"
        )
        etcd_url = etcd.start(self, bin_dir, timeout)
        apiserver.start(
            self, bin_dir, etcd_url, gates, timeout, service_cidr=service_cidr, with_node=net is not None
        )
        controllers.start(self, bin_dir, gates, timeout)
        # Pods need their namespace's 'default' ServiceAccount, made by the controller-manager.
        self.wait_default_sa("default", timeout)

    def _start_heartbeat(self, sims: Sequence[SimNode]) -> None:
        c = self.paths.certs
        self._spawn(
            "node-heartbeat",
            [
                sys.executable, "-m", f"{PREFIX}webhook.dev.nodes",
                "--server", self.server,
                "--ca", str(c / "ca.crt"),
                "--cert", str(c / "admin.crt"),
                "--key", str(c / "admin.key"),
                *[n.name for n in sims],
            ],
            env={"PYTHONPATH": str(REPO_ROOT)},
        )  # fmt: skip

    def _start_real_node(
        self,
        net: network.NodeNet,
        bins: NodeBins,
        node: RealNode,
        images: Sequence[Path],
        sandbox_image: str,
        timeout: float,
    ) -> None:
        c = self.paths.certs
        for user in ("kubelet", "kube-proxy"):
            apiserver.write_kubeconfig(c, self.paths.root / f"{user}.kubeconfig", self.server, user)
        t0 = time.monotonic()
        # The GPUs are the driver's to simulate: it lays out its own driver root, device nodes
        # included, under its plugin directory (driver/sim/driverroot.py); nothing goes in the host's /dev.
        cp = containerd.ContainerdPaths.of(self.paths.node, net)
        network.write_cni_config(net, cp.cni_conf, cp.cni_ipam)
        containerd.start(self, net, bins, sandbox_image, timeout)
        for archive in images:
            t1 = time.monotonic()
            containerd.import_image(bins, cp, archive)
            self.progress(f"imported {archive.name} ({time.monotonic() - t1:.1f}s)")
        kubelet.start(self, net, bins, cp, node, timeout)
        # After the kubelet: kube-proxy reads the node's addresses at start and exits when they change.
        network.start_kube_proxy(self, net, bins.bin, node.name, timeout)
        self.progress(f"real node {node.name} up ({time.monotonic() - t0:.1f}s)")

    def restart_kubelet(self, timeout: float = 120.0) -> None:
        """Start the real node's kubelet again (after a crash test stopped or killed it)."""
        net, node = self.net, self.state.get("real_node")
        if net is None or node is None:
            raise ClusterError("this cluster has no real node")
        real = RealNode(node["name"], node["topology"], self._node_labels())
        kubelet.start(self, net, self.node_bins(), self.containerd_paths(), real, timeout)

    def _node_labels(self) -> dict[str, str]:
        n = self.kube().get(f"/api/v1/nodes/{self.real_node}")
        return {k: v for k, v in n["metadata"]["labels"].items() if k.startswith("draguard.io/gpu")}

    def add_node(self, name: str, **kw: Any) -> realnodes.AddedNode:
        """One more real node (webhook/dev/realnodes.py); by default GPUs from a device plugin."""
        return realnodes.add(self, name, **kw)

    def remove_node(self, name: str) -> list[str]:
        return realnodes.remove(self, name)

    def wait_default_sa(self, namespace: str, timeout: float = 60.0) -> None:
        kube = self.kube()
        deadline = time.monotonic() + timeout
        while True:
            try:
                kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
                return
            except ApiError as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise ClusterError(f"ServiceAccount {namespace}/default not created: {exc}") from None
            time.sleep(0.2)

    # ---- draguard parts ----------------------------------------------------------------------
    def draguard_argv(self, *args: str) -> list[str]:
        return addons.draguard_argv(*args)

    def start_drivers(self, nodes: Sequence[SimNode], timeout: float = 120.0) -> None:
        """One simulated-NVML driver per simulated node, its files in the state directory."""
        for node in nodes:
            d = self.paths.drivers / node.name
            addons.start_driver(
                self, node.name, node.topology, DriverDirs(d / "plugins", d / "registry", d / "cdi"), timeout
            )

    def real_node_driver_dirs(self) -> DriverDirs:
        net = self.net
        if net is None:
            raise ClusterError("this cluster has no real node")
        plugins, registry = kubelet.plugin_dirs(net)
        return DriverDirs(plugins / addons.DRIVER_NAME, registry, self.containerd_paths().cdi)

    def start_real_node_driver(
        self, timeout: float = 120.0, topology: str | None = None,
        args: Sequence[str] = (), env: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        """The real node's driver on the host: the kubelet's plugin directories, containerd's CDI dir.

        `topology` replaces the node's simulated GPUs, `args` are added to `driver run` and `env` to its
        environment, for this run of the driver only (a later call without them goes back to the
        node's own GPUs and the default mode).
        """
        node = self.state["real_node"]
        dirs = self.real_node_driver_dirs()
        addons.start_driver(self, node["name"], topology or node["topology"], dirs, timeout, args, env)
        # A restarted driver's slices stay published, so they do not say the kubelet knows the new
        # plugin yet; a pod started in between fails its prepare ("not registered") and is retried
        # only after the kubelet's back-off. A stopped kubelet registers it when it starts again.
        if "kubelet" not in self.running():
            return
        name = f"driver-{node['name']}"
        took = self.wait(name, lambda: "kubelet registered plugin" in self.current_log(name), timeout)
        self.progress(f"the kubelet registered the driver on {node['name']} ({took:.1f}s)")

    def nvml_events_path(self, node: str) -> Path:
        return addons.nvml_events_path(self, node)

    def start_webhook(self, policies: Path, timeout: float = 60.0) -> None:
        addons.start_webhook(self, policies, timeout)

    def webhook_objects(self, port: int) -> tuple[list[dict[str, Any]], str]:
        return addons.webhook_objects(self, port)

    def register_webhook(self, port: int) -> str:
        return addons.register_webhook(self, port)

    # ---- kubectl -------------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """Run the built kubectl against this cluster; returns stdout, raises ClusterError on failure."""
        proc = self.kubectl_run(*args, input=input)
        if check and proc.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc.stdout

    def kubectl_run(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )

    # ---- tear-down and status --------------------------------------------------------------------
    def down(self, keep_logs: bool = True) -> list[str]:
        """Stop every recorded process and undo the real node's host changes; returns what went."""
        stopped: list[str] = []
        net = self.net
        for extra in realnodes.names(self):
            try:
                stopped += realnodes.remove(self, extra)
            except ClusterError as exc:
                self.progress(f"node {extra} not fully removed: {exc}")
        if net is not None:
            for name in (*NODE_FIRST, *[n for n in self.running() if n.startswith("driver-")]):
                if self.stop(name):
                    stopped.append(name)
            try:
                bins = self.node_bins()
                cp = self.containerd_paths()
                if "containerd" in self.running():
                    n = containerd.remove_all_pods(bins, cp)
                    if n:
                        stopped.append(f"{n} pod sandboxes")
            except ClusterError as exc:
                self.progress(f"pods not removed through containerd: {exc}")
        stopped += self.stop_all()
        if net is not None:
            undone = realnodes.teardown_host(self, net, self.paths.node)
            self.state.pop("node_net", None)
            if undone:
                self.progress("undone: " + ", ".join(undone))
        on_link = bool(self.state.get("apiserver_address"))
        busy = [
            f"{n}:{p}"
            for n, p in (self.state.get("ports") or {}).items()
            # An API server on the node link went with the link; the rest listen on loopback.
            if not (on_link and n == "kube-apiserver") and port_open(int(p))
        ]
        if self.paths.root.exists():
            self._save_state()
            if not keep_logs:
                self._reset_state_dir(recreate=False)
        if busy:
            raise ClusterError(
                f"stopped {', '.join(stopped) or 'nothing'} but ports still in use: {', '.join(busy)}"
            )
        return stopped

    def status(self) -> dict[str, Any]:
        alive = self.running()
        net = self.net
        out: dict[str, Any] = {
            "state_dir": str(self.paths.root),
            "kubeconfig": str(self.kubeconfig) if self.paths.kubeconfig.exists() else None,
            "ready": self.is_up(),
            "components": {
                n: {"pid": p, "alive": n in alive} for n, p in (self.state.get("pids") or {}).items()
            },
            "ports": self.state.get("ports") or {},
            "nodes": [n["name"] for n in self.state.get("nodes") or []],
            "added_nodes": realnodes.names(self),
            "feature_gates": self.state.get("feature_gates"),
            "logs": str(self.paths.logs),
        }
        if net is not None:
            out["real_node"] = {
                **(self.state.get("real_node") or {}),
                "netns": net.netns,
                "node_ip": net.node_ip,
                "apiserver": self.server,
                "pod_cidr": net.pod_cidr,
                "service_cidr": net.service_cidr,
                "netns_present": net.netns in network._netns_list(),
            }
        return out
