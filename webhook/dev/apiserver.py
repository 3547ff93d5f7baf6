"""kube-apiserver for the local cluster, and the kubeconfigs of its clients."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from .kube import Kube
from .procs import Supervisor

# DRA feature gates draguard exercises; only those the release still lets you set are passed
# (a gate that went GA and was locked, or was removed, is on anyway or would be an error).
WANTED_GATES = ("DRAExtendedResource", "DRAAdminAccess", "DRAPrioritizedList")
RUNTIME_CONFIG = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"
SERVICE_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Without a real node nothing routes Service addresses, so the classic range is only bookkeeping.
DEFAULT_SERVICE_CIDR = "10.96.0.0/16"


def feature_gates(sup: Supervisor, bin_dir: Path) -> str:
    """The --feature-gates value: the wanted DRA gates this release still lets one set."""
    out = subprocess.run(
        [str(bin_dir / "kube-apiserver"), "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    settable = set(re.findall(r"\b([A-Z][A-Za-z0-9]+)=true\|false", out))
    gates = [f"{g}=true" for g in WANTED_GATES if g in settable]
    sup.state["feature_gates"] = gates
    sup.state["locked_or_absent_gates"] = [g for g in WANTED_GATES if g not in settable]
    return ",".join(gates)


def server_url(state: dict[str, Any]) -> str:
    host = state.get("apiserver_address") or "127.0.0.1"
    return f"https://{host}:{state['ports']['kube-apiserver']}"


def write_kubeconfig(certs: Path, path: Path, server: str, user: str) -> None:
    """A kubeconfig for `user` (certs/<user>.crt/.key) with the certificates inline."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "draguard-dev",
                "cluster": {"server": server, "certificate-authority-data": b64(certs / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(certs / f"{user}.crt"),
                    "client-key-data": b64(certs / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "draguard-dev", "context": {"cluster": "draguard-dev", "user": user}}],
        "current-context": "draguard-dev",
    }
    path.write_text(json.dumps(doc, indent=2))
    path.chmod(0o600)


def start(
    sup: Supervisor,
    bin_dir: Path,
    etcd_url: str,
    gates: str,
    timeout: float,
    *,
    service_cidr: str = DEFAULT_SERVICE_CIDR,
    with_node: bool = False,
) -> None:
    """Start the API server; with a real node it serves on the node link and can reach kubelets."""
    state = sup.state
    c = sup.paths.certs
    address = state.get("apiserver_address") or "127.0.0.1"
    node_flags: list[str] = []
    if with_node:
        node_flags = [
            # Node names do not resolve in DNS here; the kubelet's InternalIP does.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={c / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={c / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={c / 'ca.crt'}",
            # Webhook Services are called at a ready endpoint's pod IP (routed to the node), not at
            # the ClusterIP, which only the node's kube-proxy translates.
            "--enable-aggregator-routing=true",
        ]
    else:
        # Endpoints for the 'kubernetes' Service would carry 127.0.0.1, which validation refuses.
        node_flags = ["--endpoint-reconciler-type=none"]
    sup.spawn(
        "kube-apiserver",
        [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={address}",
            f"--advertise-address={address}",
            f"--secure-port={state['ports']['kube-apiserver']}",
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
            f"--service-cluster-ip-range={service_cidr}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            f"--runtime-config={RUNTIME_CONFIG}",
            "--profiling=false",
            *node_flags,
            *([f"--feature-gates={gates}"] if gates else []),
        ],
    )
    server = server_url(state)
    for user, name in (
        ("admin", "admin.kubeconfig"),
        ("controller-manager", "controller-manager.kubeconfig"),
        ("scheduler", "scheduler.kubeconfig"),
    ):
        write_kubeconfig(c, sup.paths.root / name, server, user)
    kube = Kube(server, c / "ca.crt", c / "admin.crt", c / "admin.key")
    took = sup.wait("kube-apiserver", lambda: kube.get("/readyz") == "ok", timeout)
    sup.progress(f"kube-apiserver ready on {server} ({took:.1f}s)")
