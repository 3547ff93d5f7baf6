"""kube-controller-manager and kube-scheduler for the local cluster."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from .procs import Supervisor, ssl_insecure


def start(sup: Supervisor, bin_dir: Path, gates: str, timeout: float) -> None:
    """Start both with their own identities; waits for their /healthz."""
    p = sup.state["ports"]
    c = sup.paths.certs
    gate_flags = [f"--feature-gates={gates}"] if gates else []
    kcm_cfg = sup.paths.root / "controller-manager.kubeconfig"
    sup.spawn(
        "kube-controller-manager",
        [
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kcm_cfg}",
            f"--authentication-kubeconfig={kcm_cfg}",
            f"--authorization-kubeconfig={kcm_cfg}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['kube-controller-manager']}",
            f"--cert-dir={c / 'kcm-generated'}",
            # Every default controller, node-lifecycle included: it lifts the not-ready taint from a
            # node whose kubelet reports Ready and marks a node whose kubelet died NotReady (so the
            # scheduler stops allocating its devices). Simulated nodes keep their leases fresh.
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={c / 'sa.key'}",
            f"--root-ca-file={c / 'ca.crt'}",
            f"--cluster-signing-cert-file={c / 'ca.crt'}",
            f"--cluster-signing-key-file={c / 'ca.key'}",
            "--leader-elect=false",
            *gate_flags,
        ],
    )
    sched_cfg = sup.paths.root / "scheduler.kubeconfig"
    sup.spawn(
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
            *gate_flags,
        ],
    )
    for name in ("kube-controller-manager", "kube-scheduler"):
        url = f"https://127.0.0.1:{p[name]}/healthz"

        def healthy(u: str = url) -> bool:
            with urllib.request.urlopen(u, context=ssl_insecure(), timeout=2) as r:
                return bool(r.read() == b"ok")

        sup.progress(f"{name} healthy ({sup.wait(name, healthy, timeout):.1f}s)")
