"""caBundle that heals, and the webhook identity that can change nothing else (real kube-apiserver).

The injector runs with a token of the bundle's draguard-webhook ServiceAccount, so these tests also
show that its RBAC (name-scoped get/list/watch/patch) is enough, and that the shipped
ValidatingAdmissionPolicy draguard-webhook-cabundle-only refuses every other change that account
could try on its own webhook configurations.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kapi import Api, api_server, sa_kubeconfig, wait_for
from kbundle import KUSTOMIZE, build, one

from webhook.certs import generate_ca
from webhook.server.cainject import CaBundleInjector, start_injector

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    with api_server() as a:
        res = a.apply_kustomization(KUSTOMIZE / "overlays" / "eks")
        assert res.returncode == 0, res.stderr
        yield a


def _bundles(api: Api, kind: str) -> list[str | None]:
    res = api.kubectl("get", kind, "draguard", "-o", "json")
    if res.returncode != 0:
        return []
    return [h["clientConfig"].get("caBundle") for h in json.loads(res.stdout)["webhooks"]]


def _whole(api: Api, b64: str) -> bool:
    return all((bs := _bundles(api, k)) and set(bs) == {b64} for k in KINDS)


def _write(path: Path, *cas: bytes) -> str:
    data = b"".join(cas)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)  # a new inode, as a Secret mount's `..data` swap gives
    return base64.b64encode(data).decode()


def test_injector_heals_wiped_recreated_and_rotated_configurations(api: Api, tmp_path: Path) -> None:
    ca1, _ = generate_ca()
    bundle = tmp_path / "ca.crt"
    b64 = _write(bundle, ca1)
    kubeconfig = sa_kubeconfig(api, "draguard-webhook", tmp_path / "webhook.kubeconfig")
    inj = start_injector(str(kubeconfig), str(bundle), "draguard")
    try:
        took = wait_for(lambda: _whole(api, b64), "caBundle injected on first start", timeout=15)
        print(f"first injection: {took:.2f} s")

        # Argo CD Replace=true (kubectl replace with the manifest from Git) wipes caBundle.
        built = build("eks")
        for kind in KINDS:
            obj = one(built, kind, "draguard")
            res = api.kubectl("replace", "-f", "-", stdin=yaml.safe_dump(obj))
            assert res.returncode == 0, res.stderr
        took = wait_for(lambda: _whole(api, b64), "caBundle after replace", timeout=10)
        print(f"healed after replace: {took:.2f} s")

        # Deleted and created again (a re-install, a prune and re-sync).
        for kind in KINDS:
            assert api.kubectl("delete", kind, "draguard").returncode == 0
            res = api.kubectl("create", "-f", "-", stdin=yaml.safe_dump(one(built, kind, "draguard")))
            assert res.returncode == 0, res.stderr
        took = wait_for(lambda: _whole(api, b64), "caBundle after delete + create", timeout=10)
        print(f"healed after re-create: {took:.2f} s")

        # Rotation: the certs Job puts the new CA first and keeps the old one; the mount changes.
        ca2, _ = generate_ca()
        b64_rotated = _write(bundle, ca2, ca1)
        took = wait_for(lambda: _whole(api, b64_rotated), "rotated bundle injected", timeout=15)
        print(f"rotated bundle in: {took:.2f} s")

        # A replica whose mount still holds the old bundle finds its CA present and writes nothing,
        # so replicas never undo each other during a rotation.
        stale_path = tmp_path / "stale-ca.crt"
        _write(stale_path, ca1)
        stale = CaBundleInjector(inj.http, inj.patcher, stale_path, "draguard")
        stale._read_bundle()
        assert stale.reconcile_all() == 0
        assert _whole(api, b64_rotated)
        assert inj.stats.errors == 0, inj.stats.last_error
    finally:
        inj.stop()


def _as_webhook(api: Api, tmp_path: Path) -> Api:
    return Api(sa_kubeconfig(api, "draguard-webhook", tmp_path / "webhook.kubeconfig"))


def _patch(who: Api, kind: str, ops: list[dict[str, object]], *extra: str) -> tuple[int, str]:
    res = who.kubectl("patch", kind, "draguard", "--type=json", "-p", json.dumps(ops), *extra)
    return res.returncode, res.stderr


def test_webhook_identity_can_change_only_cabundle(api: Api, tmp_path: Path) -> None:
    webhook = _as_webhook(api, tmp_path)
    vwc = "validatingwebhookconfiguration"
    widen = [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]
    # The policy is in force once the API server has loaded it: probe with a dry run, so that a
    # probe made before it is in force changes nothing.
    wait_for(
        lambda: _patch(webhook, vwc, widen, "--dry-run=server")[0] != 0,
        "ValidatingAdmissionPolicy draguard-webhook-cabundle-only in force",
    )
    ca, _ = generate_ca()
    b64 = base64.b64encode(ca).decode()
    rc, err = _patch(webhook, vwc, [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": b64}])
    assert rc == 0, err
    attempts = {
        "fail open": widen,  # a no-op on the mutating webhooks, which already fail open
        "stretch the timeout": [{"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": 30}],
        "widen the rules": [
            {"op": "add", "path": "/webhooks/0/rules/0/resources/-", "value": "secrets"},
        ],
        "call elsewhere": [
            {"op": "replace", "path": "/webhooks/0/clientConfig/service/name", "value": "evil"},
        ],
        "drop the namespace exclusion": [{"op": "remove", "path": "/webhooks/0/namespaceSelector"}],
        "drop a match condition": [{"op": "remove", "path": "/webhooks/0/matchConditions"}],
        "remove a webhook": [{"op": "remove", "path": "/webhooks/1"}],
        "relabel": [{"op": "add", "path": "/metadata/labels/x", "value": "y"}],
    }
    for what, ops in attempts.items():
        for kind in (vwc, "mutatingwebhookconfiguration"):
            if what == "fail open" and kind != vwc:
                continue
            rc, err = _patch(webhook, kind, ops)
            assert rc != 0, f"{what} on {kind} was allowed"
            assert "may change only clientConfig.caBundle" in err, (what, err)
    # Outside what RBAC grants at all.
    other = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "other"},
        "webhooks": [],
    }
    for args, stdin in (
        (("delete", vwc, "draguard"), None),
        (("create", "--dry-run=server", "-f", "-"), yaml.safe_dump(other)),
        (("annotate", "-n", "draguard-system", "secret", "draguard-webhook-tls", "x=y"), None),
        (("get", "-n", "draguard-system", "secret", "draguard-webhook-tls-ca"), None),
    ):
        res = webhook.kubectl(*args, stdin=stdin)
        assert res.returncode != 0 and "forbidden" in res.stderr.lower(), (args, res.stderr)
    # The policy binds only that account: an admin still changes the configuration as usual.
    rc, err = _patch(api, vwc, widen, "--dry-run=server")
    assert rc == 0, err


UNINSTALL = KUSTOMIZE / "uninstall.sh"


def _claim(api: Api) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "held", "namespace": "kube-system"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-a100"}}]}
        },
    }
    res = api.kubectl("create", "-f", "-", stdin=yaml.safe_dump(claim))
    assert res.returncode == 0, res.stderr
    status = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}
                    ]
                }
            }
        }
    }
    res = api.kubectl(
        "-n", "kube-system", "patch", "resourceclaim", "held", "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr


REPORT_CRDS = ("policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io")


def _report(api: Api, kind: str, name: str, namespace: str | None, labels: dict[str, str]) -> None:
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if namespace:
        meta["namespace"] = namespace
    doc = {"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": kind, "metadata": meta, "results": []}
    res = api.kubectl("create", "-f", "-", stdin=yaml.safe_dump(doc))
    assert res.returncode == 0, res.stderr


def _uninstall(api: Api, *extra: str) -> Any:
    import os
    import subprocess

    return subprocess.run(
        ["bash", str(UNINSTALL), str(KUSTOMIZE / "overlays" / "eks"), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KUBECONFIG": str(api.kubeconfig)},
        check=False,
    )


def test_uninstall_removes_webhook_configurations_first_and_waits_for_claims(api: Api) -> None:
    """Runs last in this module: it removes the bundle."""
    assert api.apply_kustomization(KUSTOMIZE / "overlays" / "eks").returncode == 0
    _claim(api)
    first = _uninstall(api)
    assert first.returncode == 2, first.stdout + first.stderr
    assert "kube-system/held" in first.stdout
    # Admission no longer calls draguard, while the driver (and its published devices) stays.
    for kind in KINDS:
        assert api.kubectl("get", kind, "draguard").returncode != 0, kind
    assert api.kubectl("-n", "draguard-driver", "get", "daemonset", "draguard-driver").returncode == 0
    assert api.kubectl("-n", "draguard-system", "get", "deployment", "draguard-webhook").returncode != 0

    assert api.kubectl("-n", "kube-system", "delete", "resourceclaim", "held").returncode == 0
    # Another tool's reports share the PolicyReport CRDs: they outlive draguard's uninstall.
    _report(api, "ClusterPolicyReport", "other-tool", None, {})
    mine = {"app.kubernetes.io/managed-by": "draguard-audit"}
    _report(api, "PolicyReport", "draguard-ns", "kube-system", mine)
    second = _uninstall(api)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "keeping the CRDs" in second.stdout and "1 reports of other tools" in second.stdout, second.stdout
    for crd in REPORT_CRDS:
        assert api.kubectl("get", "crd", crd).returncode == 0, crd
    assert api.kubectl("get", "clusterpolicyreport", "other-tool").returncode == 0
    assert api.kubectl("-n", "kube-system", "get", "policyreport", "draguard-ns").returncode != 0
    steps = [line for line in second.stdout.splitlines() if line.startswith("[uninstall]")]
    assert [s.split()[1] for s in steps[:4]] == ["1/4", "2/4", "3/4", "4/4"]
    for kind in ("deviceclass", "clusterrole", "validatingadmissionpolicy"):
        left = api.kubectl("get", kind, "-l", "app.kubernetes.io/part-of=draguard", "-o", "name")
        assert left.returncode == 0 and left.stdout.strip() == "", (kind, left.stdout)
    ns = json.loads(api.kubectl("get", "namespace", "draguard-system", "-o", "json").stdout or "{}")
    # No namespace controller runs here: the namespace is left terminating, not deleted.
    assert not ns or ns["metadata"].get("deletionTimestamp"), ns

    # Once no other tool's report is left, the CRDs go with the rest.
    assert api.kubectl("delete", "clusterpolicyreport", "other-tool").returncode == 0
    third = _uninstall(api)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "keeping the CRDs" not in third.stdout
    for crd in REPORT_CRDS:
        gone = api.kubectl("get", "crd", crd, "-o", "jsonpath={.metadata.deletionTimestamp}")
        assert gone.returncode != 0 or gone.stdout.strip(), crd
