"""Security properties checked against real parts.

- RBAC: the bundle's RBAC applied to a real kube-apiserver (RBAC authorizer), then
  `kubectl auth can-i --list --as=system:serviceaccount:<namespace>:<sa>` for every service
  account: no wildcard, no Secret beyond its own, nothing cluster-wide on Secrets.
- Logs: at info level the webhook logs who/what/verdict, never object contents.
- Manifests: every container of the built bundle has a read-only root filesystem and no privilege
  escalation; every workload but the driver DaemonSet (privileged by necessity, documented in its
  manifest) runs as non-root.
(TLS below 1.2 refused: test_cert_rotation.py::test_tls_below_1_2_refused.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.reliability.conftest import ROOT, WebhookProcess, review_body, unavailable

SERVICE_ACCOUNTS = ("draguard-webhook", "draguard-driver", "draguard-certs", "draguard-audit")
OWN_SECRETS = {
    "draguard-webhook": {"draguard-webhook-tls"},
    "draguard-certs": {"draguard-webhook-tls", "draguard-webhook-tls-ca"},
    "draguard-driver": set(),
    "draguard-audit": set(),  # it lists workloads and writes PolicyReports, never reads a Secret
}
# The driver's own namespace is the bundle's only Pod Security `privileged` one.
SA_NAMESPACE = {"draguard-webhook": "draguard-system", "draguard-certs": "draguard-system",
                "draguard-audit": "draguard-system", "draguard-driver": "draguard-driver"}  # fmt: skip
# Granted to every authenticated identity by the API server's default bindings.
DEFAULT_RESOURCES = {
    "selfsubjectreviews.authentication.k8s.io",
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
}


def _kubectl() -> str | None:
    sys.path.insert(0, str(ROOT / "tests" / "driver"))
    from tests.apiserver import find_bin

    b = find_bin()
    if b is not None and (b / "kubectl").exists():
        return str(b / "kubectl")
    return shutil.which("kubectl")


def _bundle() -> list[dict[str, Any]]:
    kubectl = _kubectl()
    if kubectl is None:
        unavailable("kubectl not found (scripts/build-k8s.sh builds one)")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "kustomize" / "base")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if isinstance(d, dict)]


@pytest.fixture(scope="module")
def apiserver() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "tests" / "driver"))
    from tests.apiserver import find_bin, start

    b = find_bin()
    if b is None:
        unavailable("kube-apiserver/etcd binaries not built (scripts/build-k8s.sh)")
    base = Path(tempfile.mkdtemp(prefix="dgr-rbac-", dir="/tmp"))
    api = start(b, base)
    try:
        yield api
    finally:
        api.stop()
        shutil.rmtree(base, ignore_errors=True)


def _can_i_list(kubectl: str, kubeconfig: Path, sa: str, namespace: str) -> list[tuple[str, str, str, str]]:
    out = subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), "auth", "can-i", "--list", "-n", namespace,
         f"--as=system:serviceaccount:{SA_NAMESPACE[sa]}:{sa}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = []
    for line in out.stdout.splitlines()[1:]:
        cols = re.split(r"\s{2,}", line.strip())
        if len(cols) == 4:
            rows.append((cols[0], cols[1], cols[2], cols[3]))
    return rows


def _names(cell: str) -> set[str]:
    return {x for x in cell.strip("[]").split() if x}


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_rbac_least_privilege(apiserver: Any, tmp_path: Path) -> None:
    kubectl = _kubectl()
    assert kubectl is not None
    keep = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    objs = [o for o in _bundle() if o.get("kind") in keep]
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"} == set(SERVICE_ACCOUNTS)
    doc = tmp_path / "rbac.json"
    doc.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    out = subprocess.run(
        [kubectl, "--kubeconfig", str(apiserver.kubeconfig), "apply", "-f", str(doc)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = {}
    for sa in SERVICE_ACCOUNTS:
        for ns in ("draguard-system", "draguard-driver", "default"):
            rows = _can_i_list(kubectl, apiserver.kubeconfig, sa, ns)
            report[f"{sa}@{ns}"] = rows
            for res, _nonres, names, verbs in rows:
                if res:
                    assert "*" not in res and "*" not in _names(verbs), (
                        f"{sa} in {ns}: wildcard {res} {verbs}"
                    )
                if res.split(".")[0] == "secrets":
                    allowed = OWN_SECRETS[sa] if ns == "draguard-system" else set()
                    granted = _names(names)
                    if _names(verbs) == {"create"}:
                        # create cannot be limited by name; only the certs job may create at all.
                        assert sa == "draguard-certs" and ns == "draguard-system", (sa, ns, verbs)
                    else:
                        assert granted and granted <= allowed, f"{sa} in {ns}: secrets {names} {verbs}"
    print("rbac:", json.dumps(report, indent=1))
    # A plain read of someone else's Secret is refused.
    for sa in SERVICE_ACCOUNTS:
        out = subprocess.run(
            [kubectl, "--kubeconfig", str(apiserver.kubeconfig), "auth", "can-i", "get", "secret/other",
             "-n", "draguard-system", f"--as=system:serviceaccount:{SA_NAMESPACE[sa]}:{sa}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.stdout.strip() == "no", (sa, out.stdout, out.stderr)


def test_info_logs_hold_no_object_contents(tmp_path: Path, certs: Path, inventory_file: Path) -> None:
    marker = "s3cr3t-7f1e9a"
    wh = WebhookProcess(tmp_path, certs, inventory_file).start(log_level="info")
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a", "annotations": {"token": marker}},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": f"registry.example.com/{marker}:1",
                        "command": ["vllm", "serve", f"--api-key={marker}"],
                        "env": [{"name": "PASSWORD", "value": marker}],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ]
            },
        }
        bodies = [
            json.dumps(review_body(pod)).encode(),
            json.dumps(review_body({**pod, "spec": marker})).encode(),  # malformed object
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "request": {"uid": "u", "object": {"x": marker}}}).encode(),
            (json.dumps(review_body(pod))[:-20]).encode(),  # truncated JSON
        ]  # fmt: skip
        statuses = []
        for body in bodies:
            for path in ("/validate", "/mutate"):
                conn = wh.connection()
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                statuses.append(conn.getresponse().status)
                conn.close()
    finally:
        wh.stop()
    log = wh.log()
    assert '"msg":"admission"' in log, "the request log line is missing (info level)"
    assert marker not in log, [ln for ln in log.splitlines() if marker in ln][:3]
    assert all(s < 500 for s in statuses), statuses


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("containers") or []) + list(spec.get("initContainers") or [])


def test_manifests_non_root_read_only() -> None:
    objs = _bundle()
    workloads = [o for o in objs if o["kind"] in ("Deployment", "DaemonSet", "Job", "CronJob", "StatefulSet")]
    assert {o["kind"] for o in workloads} >= {"Deployment", "DaemonSet", "Job", "CronJob"}
    privileged = []
    for o in workloads:
        tmpl = (
            o["spec"]["jobTemplate"]["spec"]["template"] if o["kind"] == "CronJob" else o["spec"]["template"]
        )
        spec = tmpl["spec"]
        pod_sc = spec.get("securityContext") or {}
        for c in _containers(spec):
            sc = c.get("securityContext") or {}
            where = f"{o['kind']}/{o['metadata']['name']} container {c['name']}"
            assert sc.get("readOnlyRootFilesystem") is True, f"{where}: root filesystem not read-only"
            if sc.get("privileged"):
                privileged.append(f"{o['kind']}/{o['metadata']['name']}")
                continue
            assert sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation"
            non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
            assert non_root is True, f"{where}: not runAsNonRoot"
            user = sc.get("runAsUser", pod_sc.get("runAsUser"))
            assert user is None or int(user) != 0, f"{where}: runs as uid 0"
            assert "ALL" in ((sc.get("capabilities") or {}).get("drop") or []), f"{where}: capabilities kept"
    assert privileged == ["DaemonSet/draguard-driver"], privileged


def _client_hello() -> bytes:
    import contextlib
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    out = ssl.MemoryBIO()
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname="draguard-webhook")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def _server_closed(sock: Any) -> bool:
    """Whether the server closed the connection (what it sent first, a server hello, is read)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def test_connections_that_never_finish_tls_cost_little_and_stay_within_the_limit(
    tmp_path: Path, certs: Path, inventory_file: Path
) -> None:
    """1,200 connections that never send a byte and 1,200 that stop after their ClientHello, at the
    shipped settings (256 connections): the replica keeps at most 256 of them, closes the rest at
    once, grows by little, and answers reviews throughout."""
    import socket

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    body = json.dumps(review_body(pod)).encode()
    wh = WebhookProcess(tmp_path, certs, inventory_file).start(log_level="warning")
    socks: list[socket.socket] = []
    try:
        for _ in range(10):
            assert wh.post("/validate", body)[0] == 200
        base = _rss(wh.pid)
        hello = _client_hello()
        for i in range(2400):
            sock = socket.create_connection(("127.0.0.1", wh.port), timeout=10)
            if i >= 1200:
                sock.sendall(hello)
            socks.append(sock)
        # Accepted in order: once this is answered, the server has seen every connection above.
        status, doc = wh.post("/validate", body)
        assert status == 200 and doc["response"]["allowed"] is True
        grown = _rss(wh.pid) - base
        open_now = sum(not _server_closed(s) for s in socks)
        assert open_now <= 256, f"{open_now} connections held past the limit of 256"
        # About 50 KiB for each of the 256 held handshakes, a few KiB for the rest: far below the
        # 300 KiB apiece the TLS layer cost when it was made at the accept.
        assert grown < 40 * 1024 * 1024, f"RSS grew {grown / 2**20:.1f} MiB"
    finally:
        for sock in socks:
            sock.close()
        wh.stop()
    assert "Traceback" not in wh.log()
