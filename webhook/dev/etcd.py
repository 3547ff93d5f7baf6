"""etcd for the local control plane: one member on loopback, data in the state directory."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from .procs import Supervisor


def start(sup: Supervisor, bin_dir: Path, timeout: float) -> str:
    """Start etcd on the recorded ports; returns its client URL once /health says so."""
    p = sup.state["ports"]
    url = f"http://127.0.0.1:{p['etcd']}"
    peer = f"http://127.0.0.1:{p['etcd-peer']}"
    sup.spawn(
        "etcd",
        [
            str(bin_dir / "etcd"),
            "--name", "default",
            "--data-dir", str(sup.paths.etcd_data),
            "--listen-client-urls", url,
            "--advertise-client-urls", url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}",
            # Throwaway data: skipping fsync makes start-up and tests much faster on slow disks.
            "--unsafe-no-fsync",
            "--log-level", "warn",
        ],
    )  # fmt: skip

    def healthy() -> bool:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return bool(json.loads(r.read()).get("health") == "true")

    sup.progress(f"etcd ready on {url} ({sup.wait('etcd', healthy, timeout):.1f}s)")
    return url
