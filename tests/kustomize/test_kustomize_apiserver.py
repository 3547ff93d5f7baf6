"""The bundle against a real kube-apiserver (etcd + kube-apiserver from scripts/build-k8s.sh).

* every overlay passes `kubectl apply --dry-run=server` (full API validation, including the CEL of the
  matchConditions and of the DeviceClass selectors, compiled by the API server itself);
* with the webhook configurations installed and no webhook pod running, the API server's own
  matchConditions and namespaceSelector decide which requests try to call draguard: GPU objects of
  every kind are refused (failurePolicy Fail), everything else is admitted without a call, and the
  fail-open component turns the refusals into admissions.

Skips when the binaries are not built; `make k8s` builds them.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kapi import Api, api_server, sa_kubeconfig
from kbundle import KUSTOMIZE, OVERLAYS, build, one

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    with api_server() as a:
        yield a


@pytest.mark.parametrize("mode", ["client-side apply", "server-side apply"])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_passes_server_side_dry_run(api: Api, overlay: str, mode: str) -> None:
    """Both the way `kubectl apply`/Argo CD sends objects and the way Flux does (server-side apply)."""
    extra = ["--server-side", "--field-manager=draguard-test"] if mode.startswith("server") else []
    res = api.apply_kustomization(KUSTOMIZE / "overlays" / overlay, "--dry-run=server", *extra)
    assert res.returncode == 0, res.stderr
    assert "(server dry run)" in res.stdout
    assert "Warning" not in res.stderr, res.stderr


def _pod_spec(gpu: bool, restart: str = "Always") -> dict[str, object]:
    limits = {"nvidia.com/gpu": "1"} if gpu else {"cpu": "100m"}
    return {
        "automountServiceAccountToken": False,
        "restartPolicy": restart,
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
    }


def _object(kind: str, gpu: bool, namespace: str = "ml") -> dict[str, object]:
    meta = {"name": f"{kind.lower()}-{'gpu' if gpu else 'cpu'}", "namespace": namespace}
    restart = "Never" if kind in {"Pod", "Job", "CronJob"} else "Always"
    tmpl = {"metadata": {"labels": {"app": "t"}}, "spec": _pod_spec(gpu, restart)}
    sel = {"matchLabels": {"app": "t"}}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": _pod_spec(gpu, restart)}
    if kind == "ReplicationController":
        return {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": meta,
            "spec": {"selector": {"app": "t"}, "template": tmpl},
        }
    if kind == "Job":
        return {"apiVersion": "batch/v1", "kind": kind, "metadata": meta, "spec": {"template": tmpl}}
    if kind == "CronJob":
        return {
            "apiVersion": "batch/v1",
            "kind": kind,
            "metadata": meta,
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": tmpl}}},
        }
    spec: dict[str, object] = {"selector": sel, "template": tmpl}
    if kind == "StatefulSet":
        spec["serviceName"] = "t"
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, "spec": spec}


WORKLOADS = {
    "Pod": "pods",
    "Deployment": "workloads",
    "ReplicaSet": "workloads",
    "StatefulSet": "workloads",
    "DaemonSet": "workloads",
    "Job": "workloads",
    "ReplicationController": "workloads",
    "CronJob": "cronjobs",
}
DRA_OBJECTS = [
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ml"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-h100"}}]
                }
            }
        },
    },
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "extra.example.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
    },
]


def _create(api: Api, obj: dict[str, object]) -> subprocess.CompletedProcess[str]:
    return api.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(obj))


def test_api_server_sends_exactly_gpu_objects_to_the_webhook(api: Api) -> None:
    installed = api.apply_kustomization(KUSTOMIZE / "overlays" / "eks")
    assert installed.returncode == 0, installed.stderr
    for kind, family in WORKLOADS.items():
        refused = _create(api, _object(kind, gpu=True))
        assert refused.returncode != 0, f"{kind} with a GPU was admitted without the webhook"
        assert f'failed calling webhook "{family}.validate.draguard.io"' in refused.stderr, refused.stderr
        admitted = _create(api, _object(kind, gpu=False))
        assert admitted.returncode == 0, f"{kind} without a GPU reached the webhook: {admitted.stderr}"
    # kube-system is excluded by name, even for GPU pods.
    assert _create(api, _object("Pod", gpu=True, namespace="kube-system")).returncode == 0
    # A pod that only references a claim is a GPU pod too.
    claim_pod = _object("Pod", gpu=False)
    claim_pod["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimTemplateName": "t"}]  # type: ignore[index]
    refused = _create(api, claim_pod)
    assert 'failed calling webhook "pods.validate.draguard.io"' in refused.stderr, refused.stderr
    template, device_class = DRA_OBJECTS
    refused = _create(api, template)
    assert 'failed calling webhook "dra.validate.draguard.io"' in refused.stderr, refused.stderr
    # DeviceClasses are admin objects the bundle itself ships: their check fails open, so an install
    # or a GitOps dry-run never waits on a webhook that is not serving yet.
    admitted = _create(api, device_class)
    assert admitted.returncode == 0, admitted.stderr


def test_fail_open_component_admits_when_the_webhook_is_down(api: Api) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kustomization.yaml").write_text(
            f"resources:\n  - {os.path.relpath(KUSTOMIZE / 'overlays' / 'eks', tmp)}\n"
            f"components:\n  - {os.path.relpath(KUSTOMIZE / 'components' / 'fail-open-validation', tmp)}\n"
        )
        res = api.apply_kustomization(Path(tmp))
    assert res.returncode == 0, res.stderr
    try:
        for kind in WORKLOADS:
            admitted = _create(api, _object(kind, gpu=True))
            assert admitted.returncode == 0, admitted.stderr
    finally:
        back = api.apply_kustomization(KUSTOMIZE / "overlays" / "eks")
        assert back.returncode == 0, back.stderr


CERTS_SCRIPT = """
import argparse, sys
from webhook.server import commands
p = argparse.ArgumentParser(prog="draguard")
commands.register(p.add_subparsers(dest="command"))
a = p.parse_args(sys.argv[1:])
sys.exit(a.func(a))
"""


def test_cert_job_identity_issues_secret_and_injects_ca(api: Api, tmp_path: Path) -> None:
    """`draguard certs`, run with exactly the Job's arguments and ServiceAccount, has every right it needs."""
    import base64
    import json
    import sys

    assert api.apply_kustomization(KUSTOMIZE / "overlays" / "eks").returncode == 0
    job = one(build("eks"), "Job", "draguard-certs")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    kubeconfig = sa_kubeconfig(api, "draguard-certs", tmp_path / "certs.kubeconfig")
    repo = KUSTOMIZE.parent
    for attempt in ("first run", "second run (renewal path)"):
        run = subprocess.run(
            [sys.executable, "-c", CERTS_SCRIPT, *args, "--kubeconfig", str(kubeconfig)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=repo,
            env={**os.environ, "PYTHONPATH": str(repo)},
        )
        assert run.returncode == 0, f"{attempt}: {run.stderr}"
    secret = json.loads(
        api.kubectl("-n", "draguard-system", "get", "secret", "draguard-webhook-tls", "-o", "json").stdout
    )
    assert secret["type"] == "kubernetes.io/tls"
    assert {"tls.crt", "tls.key", "ca.crt"} <= set(secret["data"])
    bundle = secret["data"]["ca.crt"]
    assert base64.b64decode(bundle).startswith(b"-----BEGIN CERTIFICATE-----")
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cfg = json.loads(api.kubectl("get", kind, "draguard", "-o", "json").stdout)
        assert {h["clientConfig"].get("caBundle") for h in cfg["webhooks"]} == {bundle}, kind
    # Re-applying the bundle (as GitOps does) keeps the injected caBundle.
    assert api.apply_kustomization(KUSTOMIZE / "overlays" / "eks").returncode == 0
    cfg = json.loads(api.kubectl("get", "validatingwebhookconfiguration", "draguard", "-o", "json").stdout)
    assert {h["clientConfig"].get("caBundle") for h in cfg["webhooks"]} == {bundle}


def _can(api: Api, sa: str, *args: str) -> bool:
    ns = "draguard-driver" if sa == "draguard-driver" else "draguard-system"
    res = api.kubectl("auth", "can-i", *args, f"--as=system:serviceaccount:{ns}:{sa}")
    return res.stdout.strip() == "yes"


def test_service_accounts_hold_what_they_need_and_nothing_broader(api: Api) -> None:
    assert api.apply_kustomization(KUSTOMIZE / "overlays" / "eks").returncode == 0
    dra = "resource.k8s.io"
    for verb in ("list", "watch"):
        for res in ("resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates"):
            assert _can(api, "draguard-webhook", verb, f"{res}.{dra}", "-A"), (verb, res)
        for res in ("namespaces", "resourcequotas"):
            assert _can(api, "draguard-webhook", verb, res, "-A"), (verb, res)
    assert _can(api, "draguard-webhook", "create", f"resourceclaimtemplates.{dra}", "-n", "ml")
    assert _can(api, "draguard-webhook", "patch", "validatingwebhookconfigurations/draguard")
    assert _can(api, "draguard-webhook", "watch", "mutatingwebhookconfigurations/draguard")
    # The serving certificate is mounted; only the certs Job reads or writes the Secrets.
    for verb in ("get", "update", "patch"):
        assert not _can(api, "draguard-webhook", verb, "secret/draguard-webhook-tls", "-n", "draguard-system")
    assert not _can(api, "draguard-webhook", "delete", "validatingwebhookconfigurations/draguard")
    assert not _can(api, "draguard-webhook", "create", "validatingwebhookconfigurations")
    assert not _can(api, "draguard-webhook", "get", "secret/draguard-webhook-tls-ca", "-n", "draguard-system")
    assert not _can(api, "draguard-webhook", "list", "secrets", "-n", "draguard-system")
    assert not _can(api, "draguard-webhook", "create", "secrets", "-n", "draguard-system")
    assert not _can(api, "draguard-webhook", "patch", "validatingwebhookconfigurations/other")
    assert not _can(api, "draguard-webhook", "create", f"resourceclaims.{dra}", "-n", "ml")
    # Quota ledgers: ConfigMaps in their own namespace only, never the policies next to the webhook.
    assert _can(api, "draguard-webhook", "update", "configmaps", "-n", "draguard-quota")
    assert _can(api, "draguard-webhook", "delete", "configmaps", "-n", "draguard-quota")  # gone namespaces'
    assert not _can(api, "draguard-webhook", "delete", "configmaps", "-n", "draguard-system")
    assert not _can(api, "draguard-webhook", "update", "configmap/draguard-policies", "-n", "draguard-system")
    assert not _can(api, "draguard-webhook", "create", "configmaps", "-n", "ml")
    for verb in ("create", "update", "delete", "list", "watch"):
        assert _can(api, "draguard-driver", verb, f"resourceslices.{dra}"), verb
    assert _can(api, "draguard-driver", "get", f"resourceclaims.{dra}", "-n", "ml")
    assert _can(api, "draguard-driver", "get", "nodes")
    assert not _can(api, "draguard-driver", "list", f"resourceclaims.{dra}", "-A")
    assert not _can(api, "draguard-driver", "get", "secrets", "-n", "draguard-system")
    assert not _can(api, "draguard-driver", "get", "secrets", "-n", "draguard-driver")
    assert not _can(api, "draguard-driver", "update", "nodes")
    # The audit lists what it judges and writes its reports; it changes nothing it judges.
    for res in ("pods", "deployments.apps", "jobs.batch", f"resourceclaims.{dra}", "namespaces"):
        assert _can(api, "draguard-audit", "list", res, "-A"), res
        assert _can(api, "draguard-audit", "watch", res, "-A"), res
    assert _can(api, "draguard-audit", "watch", f"resourceslices.{dra}", "-A")
    assert not _can(api, "draguard-audit", "update", f"resourceslices.{dra}")
    assert not _can(api, "draguard-audit", "get", f"resourceslices.{dra}")
    assert _can(api, "draguard-audit", "patch", "policyreports.wgpolicyk8s.io", "-n", "ml")
    assert _can(api, "draguard-audit", "delete", "clusterpolicyreports.wgpolicyk8s.io")
    assert not _can(api, "draguard-audit", "list", "secrets", "-A")
    assert not _can(api, "draguard-audit", "get", "secret/draguard-webhook-tls", "-n", "draguard-system")
    assert not _can(api, "draguard-audit", "update", "deployments.apps", "-n", "ml")
    assert not _can(api, "draguard-audit", "delete", "pods", "-n", "ml")
    assert not _can(api, "draguard-audit", "patch", "configmap/draguard-policies", "-n", "draguard-system")
    assert not _can(api, "draguard-certs", "create", "secrets", "-n", "ml")
    assert not _can(api, "draguard-certs", "get", "secret/other", "-n", "draguard-system")
