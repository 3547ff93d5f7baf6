"""A real local Kubernetes control plane (etcd, API server, controller-manager, scheduler).

Binaries come from `scripts/build-k8s.sh`.  Everything runs as the current user
on loopback ports chosen at start-up; state, certificates and one log file per
component live in a single state directory, so `down` can find and stop every
process it started and nothing is left listening.  There is no kubelet: Nodes
are simulated (webhook.dev.nodes), pods are scheduled and bound but never run.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook.dev import pki
from webhook.dev.kube import ApiError, Kube
from webhook.dev.nodes import SimNode, register_nodes

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
BINARIES = (*CONTROL_PLANE, "kubectl")
# DRA feature gates draguard exercises; only those the release still lets you set are passed
# (a gate that went GA and was locked, or was removed, is on anyway or would be an error).
WANTED_GATES = ("DRAExtendedResource", "DRAAdminAccess", "DRAPrioritizedList")
RUNTIME_CONFIG = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Server-side apply manager of what the harness registers; applying with it again replaces the fields.
FIELD_MANAGER = "draguard-dev"
SERVICE_ISSUER = "https://kubernetes.default.svc.cluster.local"

Progress = Callable[[str], None]


class ClusterError(Exception):
    """The local cluster could not be started, reached or stopped; the message says why."""


def default_state_dir() -> Path:
    env = os.environ.get("DRAGUARD_DEV_STATE")
    return Path(env) if env else Path.home() / ".cache" / "draguard" / "dev"


def default_cache_dir() -> Path:
    env = os.environ.get("DRAGUARD_K8S_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "draguard" / "k8s"


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", name))


def find_bin_dir(explicit: str | Path | None = None) -> Path:
    """Where the Kubernetes binaries are: the argument, $DRAGUARD_K8S_BIN, or the newest build."""
    if explicit is None:
        explicit = os.environ.get("DRAGUARD_K8S_BIN") or None
    if explicit is not None:
        cands = [Path(explicit)]
    else:
        root = default_cache_dir()
        versions = sorted(
            (p for p in root.glob("*/bin") if p.is_dir()),
            key=lambda p: _version_key(p.parent.name),
            reverse=True,
        )
        cands = versions
    for bin_dir in cands:
        missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
        if not missing:
            return bin_dir
        if explicit is not None:
            raise ClusterError(
                f"{bin_dir}: missing {', '.join(missing)}; run scripts/build-k8s.sh "
                "or point DRAGUARD_K8S_BIN at a directory holding all of " + ", ".join(BINARIES)
            )
    raise ClusterError(
        f"no Kubernetes binaries under {default_cache_dir()}; build them with scripts/build-k8s.sh "
        "(20-40 minutes the first time) or set DRAGUARD_K8S_BIN"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _die_with_parent() -> None:
    """In the child before exec: ask the kernel for SIGTERM when the parent exits (Linux)."""
    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def proc_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass(frozen=True)
class Paths:
    """Layout of the state directory."""

    root: Path

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def drivers(self) -> Path:
        return self.root / "drivers"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"


DEFAULT_NODES = (
    SimNode("gpu-a100-0", "a100-4x-nvlink.yaml", {"draguard.io/gpu-product": "a100"}),
    # A second NVLink A100 node: a 4-GPU training claim still fits while other pods hold A100s.
    SimNode("gpu-a100-1", "a100-4x-nvlink.yaml", {"draguard.io/gpu-product": "a100"}),
    SimNode("gpu-h100-0", "h100-8x-nvlink.yaml", {"draguard.io/gpu-product": "h100"}),
    SimNode("gpu-mig-0", "a100-4x-mig.yaml", {"draguard.io/gpu-product": "a100-mig"}),
)


def _ssl_insecure() -> ssl.SSLContext:
    # Only for the controller-manager's and scheduler's /healthz, served with throwaway self-signed certs.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class LocalCluster:
    """Start, inspect and stop the local control plane recorded in one state directory."""

    def __init__(
        self,
        state_dir: Path | None = None,
        bin_dir: Path | None = None,
        progress: Progress | None = None,
        *,
        tie_to_parent: bool = False,
    ) -> None:
        self.paths = Paths(state_dir or default_state_dir())
        # Test sessions: components get SIGTERM when this process dies, even by SIGKILL, so a killed
        # test run leaves no cluster behind. `dev up` leaves this off: its cluster outlives the CLI.
        self.tie_to_parent = tie_to_parent
        self._bin_dir = bin_dir
        self.progress: Progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.state: dict[str, Any] = self._load_state()

    # ---- state -------------------------------------------------------------------------------
    def _load_state(self) -> dict[str, Any]:
        try:
            data = json.loads(self.paths.state.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save_state(self) -> None:
        self.paths.root.mkdir(parents=True, exist_ok=True)
        tmp = self.paths.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2, sort_keys=True))
        tmp.replace(self.paths.state)

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
        return f"https://127.0.0.1:{self.state['ports']['kube-apiserver']}"

    def kube(self) -> Kube:
        c = self.paths.certs
        return Kube(self.server, c / "ca.crt", c / "admin.crt", c / "admin.key")

    def running(self) -> dict[str, int]:
        """Components whose recorded process is still alive, name -> pid."""
        alive: dict[str, int] = {}
        for name, pid in (self.state.get("pids") or {}).items():
            if self._ours(name, int(pid)):
                alive[name] = int(pid)
        return alive

    def is_up(self) -> bool:
        alive = self.running()
        if not all(c in alive for c in CONTROL_PLANE):
            return False
        try:
            return bool(self.kube().get("/readyz") == "ok")
        except (ApiError, OSError, KeyError):
            return False

    # ---- processes -----------------------------------------------------------------------------
    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        self.paths.pids.mkdir(parents=True, exist_ok=True)
        log = open(self.paths.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        try:
            # A new session per component: down() signals the whole group, children included.
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.tie_to_parent else None,
                env={**os.environ, **(env or {})},
                cwd=str(self.paths.root),
            )
        except OSError as exc:
            raise ClusterError(f"cannot start {name} ({argv[0]}): {exc}") from None
        finally:
            log.close()
        start = proc_start_time(proc.pid)
        (self.paths.pids / f"{name}.pid").write_text(f"{proc.pid} {start}\n")
        self.state.setdefault("pids", {})[name] = proc.pid
        self.state.setdefault("starts", {})[name] = start
        self.state["order"] = [n for n in self.state.get("order") or [] if n != name] + [name]
        self._save_state()
        return proc.pid

    def log_tail(self, name: str, lines: int = 25) -> str:
        try:
            text = (self.paths.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def all_logs(self, lines: int = 60) -> str:
        """The tail of every component's log, for test failure reports."""
        out = []
        for log in sorted(self.paths.logs.glob("*.log")):
            out.append(f"----- {log.name} (last {lines} lines) -----")
            out.append(self.log_tail(log.stem, lines))
        return "\n".join(out)

    def _wait(self, name: str, check: Callable[[], bool], timeout: float) -> float:
        start = time.monotonic()
        pid = self.state["pids"][name]
        while True:
            try:
                if check():
                    return time.monotonic() - start
            except (OSError, ApiError, ValueError):
                pass
            if not pid_alive(pid):
                raise ClusterError(
                    f"{name} exited during start-up; its log ends with:\n{self.log_tail(name)}"
                )
            if time.monotonic() - start > timeout:
                raise ClusterError(
                    f"{name} not ready after {timeout:.0f} s; its log ends with:\n{self.log_tail(name)}"
                )
            time.sleep(0.25)

    def _ours(self, name: str, pid: int) -> bool:
        """True only for a live process this harness started: same start time, own process group."""
        if pid <= 1 or pid == os.getpid() or not pid_alive(pid):
            return False
        recorded = (self.state.get("starts") or {}).get(name)
        if recorded is None or proc_start_time(pid) != recorded:
            return False  # the pid was reused by an unrelated process
        try:
            return os.getpgid(pid) == pid
        except ProcessLookupError:
            return False

    def _stop_pid(self, name: str, pid: int, grace: float = 10.0) -> None:
        # Signals go only to the process group of a process we started (checked by start time),
        # never to a bare or recycled pid.
        if not self._ours(name, pid):
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                # Reap it if it is our child (start-up in this process); harmless otherwise.
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                if not pid_alive(pid):
                    return
                time.sleep(0.1)
        raise ClusterError(f"{name} (pid {pid}) did not stop")

    def stop(self, name: str) -> bool:
        """Stop one component (e.g. the webhook, to test failure policies); True if it was running."""
        pid = (self.state.get("pids") or {}).get(name)
        if pid is None or not self._ours(name, int(pid)):
            return False
        self._stop_pid(name, int(pid))
        self.state["pids"].pop(name, None)
        self.state["order"] = [n for n in self.state.get("order") or [] if n != name]
        (self.paths.pids / f"{name}.pid").unlink(missing_ok=True)
        self._save_state()
        return True

    # ---- start-up ------------------------------------------------------------------------------
    def _feature_gates(self) -> str:
        out = subprocess.run(
            [str(self.bin_dir / "kube-apiserver"), "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        settable = set(re.findall(r"\b([A-Z][A-Za-z0-9]+)=true\|false", out))
        gates = [f"{g}=true" for g in WANTED_GATES if g in settable]
        self.state["feature_gates"] = gates
        self.state["locked_or_absent_gates"] = [g for g in WANTED_GATES if g not in settable]
        return ",".join(gates)

    def _make_certs(self) -> None:
        c = self.paths.certs
        c.mkdir(parents=True, exist_ok=True)
        ca = pki.make_ca(c, "ca")
        pki.issue(
            ca,
            c,
            "apiserver",
            cn="kube-apiserver",
            server_names=(
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "10.96.0.1",
            ),
        )
        pki.issue(ca, c, "admin", cn="draguard-admin", org="system:masters", client=True)
        pki.issue(ca, c, "controller-manager", cn="system:kube-controller-manager", client=True)
        pki.issue(ca, c, "scheduler", cn="system:kube-scheduler", client=True)
        pki.make_sa_keys(c)
        wca = pki.make_ca(c, "webhook-ca")
        pki.issue(wca, c, "webhook", cn="draguard-webhook", server_names=("127.0.0.1", "localhost"))

    def _reset_state_dir(self, recreate: bool = True) -> None:
        """Empty the state directory, refusing one that holds anything but a draguard dev state."""
        root = self.paths.root
        if root.exists() and any(root.iterdir()) and not self.paths.state.exists():
            raise ClusterError(
                f"{root} is not empty and holds no state.json, so it is not a draguard dev state "
                "directory; refusing to delete it (pass --state-dir with a new or empty directory)"
            )
        if root.exists():
            shutil.rmtree(root)
        if recreate:
            root.mkdir(parents=True)

    def _write_kubeconfig(self, path: Path, user: str) -> None:
        c = self.paths.certs

        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "draguard-dev",
                    "cluster": {"server": self.server, "certificate-authority-data": b64(c / "ca.crt")},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(c / f"{user}.crt"),
                        "client-key-data": b64(c / f"{user}.key"),
                    },
                }
            ],
            "contexts": [{"name": "draguard-dev", "context": {"cluster": "draguard-dev", "user": user}}],
            "current-context": "draguard-dev",
        }
        path.write_text(json.dumps(doc, indent=2))
        path.chmod(0o600)

    def up(
        self,
        nodes: Sequence[SimNode] = DEFAULT_NODES,
        *,
        with_driver: bool = True,
        with_webhook: bool = True,
        policies: Path | None = None,
        timeout: float = 180.0,
    ) -> None:
        """Start everything (or report that it already runs).  Raises ClusterError with the cause."""
        if self.is_up():
            self.progress(f"already up: kubeconfig {self.kubeconfig}")
            return
        if self.running():
            self.progress("cleaning up a half-started cluster")
            self.down()
        bin_dir = self.bin_dir
        t_all = time.monotonic()
        self._reset_state_dir()
        self.state = {"bin_dir": str(bin_dir), "pids": {}, "order": [], "ports": {}}
        ports = self.state["ports"]
        for name in ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            ports[name] = free_port()
        self._save_state()
        try:
            self._start_control_plane(bin_dir, timeout)
            kube = self.kube()
            t0 = time.monotonic()
            register_nodes(kube, nodes)
            self.state["nodes"] = [{"name": n.name, "topology": n.topology} for n in nodes]
            c = self.paths.certs
            self._spawn(
                "node-heartbeat",
                [
                    sys.executable,
                    "-m",
                    "webhook.dev.nodes",
                    "--server",
                    self.server,
                    "--ca",
                    str(c / "ca.crt"),
                    "--cert",
                    str(c / "admin.crt"),
                    "--key",
                    str(c / "admin.key"),
                    *[n.name for n in nodes],
                ],
                env={"PYTHONPATH": str(REPO_ROOT)},
            )
            self.progress(f"{len(nodes)} simulated GPU nodes Ready ({time.monotonic() - t0:.1f}s)")
            if with_driver:
                self.start_drivers(nodes, timeout)
            if with_webhook:
                self.start_webhook(policies or REPO_ROOT / "policies", timeout)
        except BaseException:
            self.progress(f"start-up failed; logs kept in {self.paths.logs}")
            self.down(keep_logs=True)
            raise
        self.state["started"] = time.time()
        self._save_state()
        self.progress(f"cluster up in {time.monotonic() - t_all:.1f}s; export KUBECONFIG={self.kubeconfig}")

    def _start_control_plane(self, bin_dir: Path, timeout: float) -> None:
        p = self.state["ports"]
        c = self.paths.certs
        t0 = time.monotonic()
        self._make_certs()
        gates = self._feature_gates()
        self.progress(
            f"certificates and keys written to {c} ({time.monotonic() - t0:.1f}s); "
            f"feature gates: {gates or '(DRA gates GA and locked on)'}"
        )
        etcd_url = f"http://127.0.0.1:{p['etcd']}"
        peer_url = f"http://127.0.0.1:{p['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name",
                "default",
                "--data-dir",
                str(self.paths.etcd_data),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                peer_url,
                "--initial-advertise-peer-urls",
                peer_url,
                "--initial-cluster",
                f"default={peer_url}",
                # Throwaway data: skipping fsync makes start-up and tests much faster on slow disks.
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
        )

        def etcd_ok() -> bool:
            with urllib.request.urlopen(f"{etcd_url}/health", timeout=2) as r:
                return bool(json.loads(r.read()).get("health") == "true")

        self.progress(f"etcd ready on {etcd_url} ({self._wait('etcd', etcd_ok, timeout):.1f}s)")

        self._spawn(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={p['kube-apiserver']}",
                f"--cert-dir={c / 'apiserver-generated'}",
                f"--tls-cert-file={c / 'apiserver.crt'}",
                f"--tls-private-key-file={c / 'apiserver.key'}",
                f"--client-ca-file={c / 'ca.crt'}",
                # Front-proxy settings: without them the controller-manager's and scheduler's
                # delegated authentication logs an error about a missing CA every few seconds.
                f"--requestheader-client-ca-file={c / 'ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--service-account-issuer={SERVICE_ISSUER}",
                f"--api-audiences={SERVICE_ISSUER}",
                f"--service-account-key-file={c / 'sa.pub'}",
                f"--service-account-signing-key-file={c / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                f"--runtime-config={RUNTIME_CONFIG}",
                # Endpoints for the 'kubernetes' Service would carry 127.0.0.1, which validation refuses.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                *([f"--feature-gates={gates}"] if gates else []),
            ],
        )
        self._write_kubeconfig(self.kubeconfig, "admin")
        self._write_kubeconfig(self.paths.root / "controller-manager.kubeconfig", "controller-manager")
        self._write_kubeconfig(self.paths.root / "scheduler.kubeconfig", "scheduler")
        kube = self.kube()
        took = self._wait("kube-apiserver", lambda: kube.get("/readyz") == "ok", timeout)
        self.progress(f"kube-apiserver ready on {self.server} ({took:.1f}s)")

        kcm_cfg = self.paths.root / "controller-manager.kubeconfig"
        self._spawn(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kcm_cfg}",
                f"--authentication-kubeconfig={kcm_cfg}",
                f"--authorization-kubeconfig={kcm_cfg}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kube-controller-manager']}",
                f"--cert-dir={c / 'kcm-generated'}",
                # No kubelet renews node health the way the node-lifecycle controller expects, so it
                # stays off: simulated Nodes keep their Ready condition and get no not-ready taints.
                "--controllers=*,-node-lifecycle-controller",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={c / 'sa.key'}",
                f"--root-ca-file={c / 'ca.crt'}",
                f"--cluster-signing-cert-file={c / 'ca.crt'}",
                f"--cluster-signing-key-file={c / 'ca.key'}",
                "--leader-elect=false",
                *([f"--feature-gates={gates}"] if gates else []),
            ],
        )
        sched_cfg = self.paths.root / "scheduler.kubeconfig"
        self._spawn(
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                f"--kubeconfig={sched_cfg}",
                f"--authentication-kubeconfig={sched_cfg}",
                f"--authorization-kubeconfig={sched_cfg}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kube-scheduler']}",
                f"--cert-dir={c / 'scheduler-generated'}",
                "--leader-elect=false",
                *([f"--feature-gates={gates}"] if gates else []),
            ],
        )
        for name in ("kube-controller-manager", "kube-scheduler"):
            url = f"https://127.0.0.1:{p[name]}/healthz"

            def healthy(u: str = url) -> bool:
                with urllib.request.urlopen(u, context=_ssl_insecure(), timeout=2) as r:
                    return bool(r.read() == b"ok")

            self.progress(f"{name} healthy ({self._wait(name, healthy, timeout):.1f}s)")
        # Pods need their namespace's 'default' ServiceAccount, made by the controller-manager.
        self.wait_default_sa("default", timeout)

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
        return [sys.executable, "-m", "webhook.cli", *args]

    def start_drivers(self, nodes: Sequence[SimNode], timeout: float = 120.0) -> None:
        """One simulated-NVML driver per node; waits until each has published its ResourceSlices."""
        if not (REPO_ROOT / "driver" / "cli.py").exists():
            self.progress("driver: driver/cli.py not present, skipping (no ResourceSlices)")
            return
        kube = self.kube()
        for node in nodes:
            d = self.paths.drivers / node.name
            for sub in ("plugins", "registry", "cdi"):
                (d / sub).mkdir(parents=True, exist_ok=True)
            topo = Path(node.topology)
            if not topo.is_absolute():
                topo = REPO_ROOT / "driver" / "sim" / "topologies" / node.topology
            name = f"driver-{node.name}"
            self._spawn(
                name,
                self.draguard_argv(
                    "driver",
                    "run",
                    "--node-name",
                    node.name,
                    "--sim",
                    str(topo),
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--plugin-dir",
                    str(d / "plugins"),
                    "--registry-dir",
                    str(d / "registry"),
                    "--cdi-root",
                    str(d / "cdi"),
                    "--metrics-port",
                    "0",
                ),
                env={"PYTHONPATH": str(REPO_ROOT)},
            )
            path = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{node.name}"

            def published(p: str = path) -> bool:
                return bool(kube.get(p).get("items"))

            took = self._wait(name, published, timeout)
            self.progress(
                f"driver on {node.name} ({node.topology}) published its ResourceSlices ({took:.1f}s)"
            )

    def start_webhook(self, policies: Path, timeout: float = 60.0) -> None:
        """Run `draguard serve` on loopback and register it with the API server by URL."""
        if not (REPO_ROOT / "webhook" / "server" / "commands.py").exists():
            self.progress("webhook: webhook/server not present, skipping")
            return
        c = self.paths.certs
        port = free_port()
        self.state["ports"]["webhook"] = port
        self._spawn(
            "webhook",
            self.draguard_argv(
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--tls-cert",
                str(c / "webhook.crt"),
                "--tls-key",
                str(c / "webhook.key"),
                "--policies",
                str(policies),
                "--kubeconfig",
                str(self.kubeconfig),
            ),
            env={"PYTHONPATH": str(REPO_ROOT)},
        )
        ctx = ssl.create_default_context(cafile=str(c / "webhook-ca.crt"))

        def ready() -> bool:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=2) as r:
                return bool(r.status == 200)

        self.progress(
            f"webhook serving on https://127.0.0.1:{port} ({self._wait('webhook', ready, timeout):.1f}s)"
        )
        self.state["policies"] = str(policies)
        self._save_state()
        source = self.register_webhook(port)
        self.progress(f"webhook configurations registered ({source})")

    def webhook_objects(self, port: int) -> tuple[list[dict[str, Any]], str]:
        """Namespace, DeviceClasses and webhook configurations of the local overlay, aimed at `port`."""
        import yaml

        overlay = REPO_ROOT / "kustomize" / "overlays" / "local"
        if not (overlay / "kustomization.yaml").exists():
            return generated_webhook_configs(port, self.webhook_ca_bundle()), "generated in code"
        out = self.kubectl("kustomize", str(overlay))
        keep = {"Namespace", "DeviceClass", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
        objs = [d for d in yaml.safe_load_all(out) if isinstance(d, dict) and d.get("kind") in keep]
        bundle = self.webhook_ca_bundle()
        for obj in objs:
            for hook in obj.get("webhooks") or []:
                cc = hook.setdefault("clientConfig", {})
                url = str(cc.get("url") or "https://127.0.0.1/validate")
                cc["url"] = re.sub(r"^https://[^/]+", f"https://127.0.0.1:{port}", url)
                cc.pop("service", None)
                cc["caBundle"] = bundle
        return objs, "kustomize/overlays/local with URL port and caBundle patched in"

    def webhook_ca_bundle(self) -> str:
        return base64.b64encode((self.paths.certs / "webhook-ca.crt").read_bytes()).decode()

    def register_webhook(self, port: int) -> str:
        objs, source = self.webhook_objects(port)
        hooks = [o for o in objs if o.get("kind", "").endswith("WebhookConfiguration")]
        rest = [o for o in objs if o not in hooks]
        # Configurations first: on a re-registration the old ones still point at a stopped webhook,
        # which (failing closed) would refuse the DeviceClasses applied in the same batch.
        for batch in (hooks, rest):
            if batch:
                doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": batch})
                self.kubectl(
                    "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
                    "-f", "-", input=doc,
                )  # fmt: skip
        return source

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
        """Stop every recorded process (reverse start order); returns what was stopped."""
        pids: dict[str, int] = dict(self.state.get("pids") or {})
        # pid files cover a state.json lost mid-start.
        if self.paths.pids.is_dir():
            starts = self.state.setdefault("starts", {})
            for f in self.paths.pids.glob("*.pid"):
                try:
                    pid_text, start_text = f.read_text().split()
                    pids.setdefault(f.stem, int(pid_text))
                    starts.setdefault(f.stem, start_text)
                except ValueError:
                    continue
        order = list(self.state.get("order") or [])
        names = [n for n in reversed(order) if n in pids] + [n for n in pids if n not in order]
        stopped = []
        for name in names:
            pid = pids[name]
            if self._ours(name, pid):
                self._stop_pid(name, pid)
                stopped.append(name)
            (self.paths.pids / f"{name}.pid").unlink(missing_ok=True)
        busy = [f"{n}:{p}" for n, p in (self.state.get("ports") or {}).items() if port_open(int(p))]
        self.state["pids"] = {}
        self.state["starts"] = {}
        self.state["order"] = []
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
        return {
            "state_dir": str(self.paths.root),
            "kubeconfig": str(self.kubeconfig) if self.paths.kubeconfig.exists() else None,
            "ready": self.is_up(),
            "components": {
                n: {"pid": p, "alive": n in alive} for n, p in (self.state.get("pids") or {}).items()
            },
            "ports": self.state.get("ports") or {},
            "nodes": [n["name"] for n in self.state.get("nodes") or []],
            "feature_gates": self.state.get("feature_gates"),
            "logs": str(self.paths.logs),
        }


def generated_webhook_configs(port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """Webhook configurations for a host-run webhook, used when the local overlay is absent."""
    ns_selector = {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "kube-node-lease", "kube-public", "draguard-system"],
            }
        ]
    }
    rules = [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]},
        {
            "apiGroups": ["apps", "batch"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["deployments", "statefulsets", "daemonsets", "replicasets", "jobs", "cronjobs"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["deviceclasses", "resourceclaims", "resourceclaimtemplates"],
        },
    ]

    def hook(name: str, path: str, policy: str) -> dict[str, Any]:
        return {
            "name": name,
            "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle},
            # /mutate only rewrites workloads' device-plugin requests; resource.k8s.io is never patched.
            "rules": rules[:2] if path == "/mutate" else rules,
            "namespaceSelector": ns_selector,
            "failurePolicy": policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }

    labels = {"app.kubernetes.io/managed-by": "draguard"}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "draguard", "labels": labels},
            "webhooks": [hook("mutate.draguard.io", "/mutate", "Ignore")],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "draguard", "labels": labels},
            "webhooks": [hook("validate.draguard.io", "/validate", "Fail")],
        },
    ]


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy; ClusterError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (ApiError, urllib.error.URLError, OSError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
