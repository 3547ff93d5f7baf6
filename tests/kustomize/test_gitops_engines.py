"""The bundle synced by the GitOps engines themselves, on a real control plane (etcd, kube-apiserver,
controller-manager, scheduler; no nodes, so nothing is scheduled):

* tools/argosync: github.com/argoproj/argo-cd/gitops-engine, the library Argo CD syncs with (waves,
  hooks, kind order, the dry-run of every task first, client-side apply or Replace=true, each wave
  healthy before the next);
* tools/fluxapply: github.com/fluxcd/pkg/ssa, Flux's apply engine, configured as kustomize-controller
  configures it (staged server-side apply, every object dry-run first, then a kstatus wait).

No webhook serves in any of these syncs (no node runs its pods; the Service has no endpoints): the
bundle's own objects must never wait on it. These tests check the order, the dry-runs and that
caBundle survives a re-sync for every overlay; the final health (every object Healthy for Argo CD,
Current for Flux, after a first sync, a re-sync, Replace=true and a sync with no webhook pod) is
checked on the real node by tests/e2e/test_gitops_real_node.py.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kbundle import build

from tests.gotool import go_tool
from webhook.certs import generate_ca
from webhook.dev.cluster import ClusterError, LocalCluster, find_bin_dir
from webhook.server.cainject import make_injector

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")


class Cluster:
    def __init__(self, lc: LocalCluster, tmp: Path) -> None:
        self.lc = lc
        self.tmp = tmp

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.lc.kubectl_run(*args, input=input)

    def manifests(self, overlay: str) -> Path:
        path = self.tmp / f"{overlay}.yaml"
        path.write_text(yaml.safe_dump_all(list(build(overlay))))
        return path

    def bundles(self, kind: str) -> list[str | None]:
        res = self.kubectl("get", kind, "draguard", "-o", "json")
        if res.returncode != 0:
            return []
        return [h["clientConfig"].get("caBundle") for h in json.loads(res.stdout)["webhooks"]]

    def reset(self) -> None:
        """Remove what a previous sync left (cluster-scoped objects and the namespace's content)."""
        for kind in ("deviceclass", "clusterrole", "clusterrolebinding", "validatingadmissionpolicy",
                     "validatingadmissionpolicybinding", *KINDS):  # fmt: skip
            self.kubectl("delete", kind, "-l", "app.kubernetes.io/part-of=draguard", "--wait=false")
        # No kubelet confirms pod shutdown here: force pods away, wait for nothing.
        for name in ("draguard-system", "draguard-driver"):
            ns = ("-n", name, "--all")
            # A Job's pod template is immutable and overlays differ in it: gone before the next sync.
            # Argo CD's hook finalizer would keep a hook Job forever here (no controller removes it).
            jobs = self.kubectl("get", "jobs", "-n", name, "-o", "name").stdout.split()
            for job in jobs:
                self.kubectl("patch", job, "-n", name, "--type=merge",
                             "-p", '{"metadata":{"finalizers":null}}')  # fmt: skip
            self.kubectl("delete", "jobs", *ns, "--wait=true", "--timeout=60s")
            self.kubectl("delete", "pods", *ns, "--force", "--grace-period=0")
            self.kubectl("delete", "all,cm,sa,role,rolebinding,pdb,resourcequota", *ns, "--wait=false")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        bin_dir = find_bin_dir()
    except ClusterError as exc:
        import os

        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(str(exc).splitlines()[0], pytrace=False)
        pytest.skip(str(exc).splitlines()[0])
    tmp = tmp_path_factory.mktemp("gitops")
    lines: list[str] = []
    lc = LocalCluster(tmp / "state", bin_dir, progress=lines.append, tie_to_parent=True)
    try:
        lc.up(nodes=(), with_driver=False, with_webhook=False)
    except ClusterError as exc:
        pytest.fail(f"control plane did not start: {exc}\n" + "\n".join(lines), pytrace=False)
    try:
        yield Cluster(lc, tmp)
    finally:
        lc.down()


def _nothing_listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def argosync(c: Cluster, overlay: str, *extra: str, timeout: int = 120) -> tuple[int, dict[str, Any]]:
    tool = go_tool("argosync")
    res = subprocess.run(
        [str(tool), "--kubeconfig", str(c.lc.kubeconfig), "--manifests", str(c.manifests(overlay)),
         "--timeout", f"{timeout}s", *extra],
        capture_output=True, text=True, timeout=timeout + 60, check=False,
    )  # fmt: skip
    assert res.stdout.strip(), f"argosync printed nothing (rc {res.returncode}):\n{res.stderr[-3000:]}"
    return res.returncode, json.loads(res.stdout)


def fluxapply(c: Cluster, overlay: str, *extra: str, timeout: int = 120) -> tuple[int, dict[str, Any]]:
    tool = go_tool("fluxapply")
    res = subprocess.run(
        [str(tool), "--kubeconfig", str(c.lc.kubeconfig), "--manifests", str(c.manifests(overlay)),
         "--timeout", f"{timeout}s", *extra],
        capture_output=True, text=True, timeout=timeout + 60, check=False,
    )  # fmt: skip
    assert res.stdout.strip(), f"fluxapply printed nothing (rc {res.returncode}):\n{res.stderr[-3000:]}"
    return res.returncode, json.loads(res.stdout)


def _healthy(report: dict[str, Any]) -> None:
    sick = [h for h in report["health"] if h["health"] != "Healthy"]
    assert not sick, sick
    kinds = {h["kind"] for h in report["health"]}
    assert {"DeviceClass", "ValidatingWebhookConfiguration", "DaemonSet", "ConfigMap"} <= kinds


def _set_ca(c: Cluster) -> str:
    """caBundle written the way the webhook's injector writes it (its own field manager)."""
    pem = generate_ca()[0]
    path = c.tmp / "ca.crt"
    path.write_bytes(pem)
    inj = make_injector(str(c.lc.kubeconfig), str(path), "draguard")
    inj._read_bundle()
    assert inj.reconcile_all() == 2, inj.stats.last_error
    return base64.b64encode(pem).decode()


@pytest.mark.parametrize("overlay", ["aks", "gke", "eks", "local"])
def test_argo_cd_creates_webhook_configurations_only_after_the_admin_objects(
    cluster: Cluster, overlay: str
) -> None:
    """Without nodes the certs Job (a Sync hook in wave -1) never completes, so the sync stops there:
    DeviceClasses and policies exist, the webhook configurations do not yet."""
    cluster.reset()
    cluster.kubectl("delete", "job", "draguard-certs", "-n", "draguard-system", "--wait=false")
    rc, rep = argosync(cluster, overlay, timeout=45)
    assert rc == 2, rep  # still running: waiting for the hook
    assert cluster.kubectl("get", "deviceclass", "gpu.nvidia.com-a100").returncode == 0
    assert cluster.kubectl("get", "configmap", "-n", "draguard-system", "-o", "name").stdout.count(
        "draguard-policies"
    )
    for kind in KINDS:
        assert cluster.bundles(kind) == [], f"{kind} created before the webhook could serve"
    hooks = [r for r in rep["results"] if r["kind"] == "Job"]
    assert hooks and hooks[0]["hookType"] == "Sync" and hooks[0]["hookPhase"] == "Running", hooks


@pytest.mark.parametrize("overlay", ["aks", "gke", "eks", "local"])
def test_flux_reapplies_a_cloud_overlay_while_no_webhook_pod_serves(cluster: Cluster, overlay: str) -> None:
    cluster.reset()
    rc, first = fluxapply(cluster, overlay)
    assert rc == 0, first
    # The configurations now exist (fail closed) and no webhook pod runs: Flux still reconciles,
    # and keeps the caBundle the injector wrote (it is not in Git).
    b64 = _set_ca(cluster)
    rc, second = fluxapply(cluster, overlay)
    assert rc == 0, second
    assert second["applied"]
    assert cluster.bundles("validatingwebhookconfiguration"), "the configurations are in place"
    for kind in KINDS:
        assert set(cluster.bundles(kind)) == {b64}, kind
