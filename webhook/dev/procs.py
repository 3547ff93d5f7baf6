"""Process bookkeeping for the local cluster: one state directory, pid files, logs, safe stops.

Every component runs as its own process group started by `Supervisor.spawn`; its pid and kernel start
time are recorded, so a stop only ever signals a process this harness started (never a recycled pid).
"""

from __future__ import annotations

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .kube import ApiError

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
BINARIES = (*CONTROL_PLANE, "kubectl")
REPO_ROOT = Path(__file__).resolve().parents[2]

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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


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


def die_with_parent() -> None:
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


def ssl_insecure() -> ssl.SSLContext:
    # Only for the controller-manager's and scheduler's /healthz, served with throwaway self-signed certs.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


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


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 60.0, input: str | None = None) -> str:
    """Run a short set-up command; ClusterError with its output when it fails."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=input)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"{' '.join(argv)}: {exc}") from None
    if check and proc.returncode != 0:
        raise ClusterError(
            f"{' '.join(argv)} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout


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

    @property
    def node(self) -> Path:
        """The real node's files: containerd, kubelet, CNI, CDI."""
        return self.root / "node"


_RUN_HEADER = "\n==== "  # starts the line each spawn writes into the component's log


class Supervisor:
    """Starts, tracks and stops the processes of one state directory."""

    def __init__(self, state_dir: Path, progress: Progress | None = None, *, tie_to_parent: bool = False):
        self.paths = Paths(state_dir)
        # Test sessions: components get SIGTERM when this process dies, even by SIGKILL, so a killed
        # test run leaves no cluster behind. `dev up` leaves this off: its cluster outlives the CLI.
        self.tie_to_parent = tie_to_parent
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

    # ---- processes -----------------------------------------------------------------------------
    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        netns: str | None = None,
    ) -> int:
        """Start `argv` as component `name` (own session, log file); in network namespace `netns`."""
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        self.paths.pids.mkdir(parents=True, exist_ok=True)
        if netns is not None:
            # nsenter joins only the network namespace and execs: same pid, same mounts as the host,
            # so the kubelet's volume mounts stay visible to containerd.
            argv = ["nsenter", f"--net=/run/netns/{netns}", "--", *argv]
        log = open(self.paths.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        log.write(f"{_RUN_HEADER}{time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        try:
            # A new session per component: a stop signals the whole group, children included.
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent if self.tie_to_parent else None,
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

    spawn = _spawn

    def current_log(self, name: str) -> str:
        """What the component's latest start has logged (each start appends a header line)."""
        text = (self.paths.logs / f"{name}.log").read_text(errors="replace")
        return text.rsplit(_RUN_HEADER, 1)[-1]

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

    wait = _wait

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
        steps = ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)) if grace > 0 else ((signal.SIGKILL, 5.0),)
        for sig, wait in steps:
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

    def running(self) -> dict[str, int]:
        """Components whose recorded process is still alive, name -> pid."""
        alive: dict[str, int] = {}
        for name, pid in (self.state.get("pids") or {}).items():
            if self._ours(name, int(pid)):
                alive[name] = int(pid)
        return alive

    def stop(self, name: str, *, grace: float = 10.0) -> bool:
        """Stop one component (e.g. the webhook, to test failure policies); True if it was running."""
        pid = (self.state.get("pids") or {}).get(name)
        if pid is None or not self._ours(name, int(pid)):
            return False
        self._stop_pid(name, int(pid), grace)
        self.state["pids"].pop(name, None)
        self.state["order"] = [n for n in self.state.get("order") or [] if n != name]
        (self.paths.pids / f"{name}.pid").unlink(missing_ok=True)
        self._save_state()
        return True

    def kill(self, name: str) -> bool:
        """SIGKILL one component's process group at once (crash tests); True if it was running."""
        return self.stop(name, grace=0.0)

    def stop_all(self) -> list[str]:
        """Stop every recorded process in reverse start order; returns the names stopped."""
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
        self.state["pids"] = {}
        self.state["starts"] = {}
        self.state["order"] = []
        return stopped
