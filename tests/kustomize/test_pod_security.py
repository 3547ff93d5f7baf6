"""Pod Security: only the DRA driver's namespace is `privileged`; the webhook and certificate pods pass
`restricted`, checked by the real kube-apiserver's PodSecurity admission.

The API server enforces Pod Security on Pods only (workload templates get warnings), so each pod
template the bundle renders is sent as a Pod, server-side dry-run, into its namespace as the bundle
labels it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kapi import Api, api_server
from kbundle import KUSTOMIZE, OVERLAYS, build, find, one, run_build

PRIVILEGED_NS = "draguard-driver"
WEBHOOK_NS = "draguard-system"
POD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")


Objs = tuple[dict[str, Any], ...] | list[dict[str, Any]]


def _pod_templates(objs: Objs) -> list[tuple[str, dict[str, Any]]]:
    """(kind/name, Pod) for every pod template in a build, in its object's namespace."""
    out = []
    for o in objs:
        if o["kind"] not in POD_KINDS:
            continue
        spec = o["spec"]
        tmpl = spec["jobTemplate"]["spec"]["template"] if o["kind"] == "CronJob" else spec["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"psa-{o['metadata']['name']}", "namespace": o["metadata"]["namespace"]},
            "spec": tmpl["spec"],
        }
        out.append((f"{o['kind']}/{o['metadata']['name']}", pod))
    return out


def _labels(objs: tuple[dict[str, Any], ...], ns: str) -> dict[str, str]:
    return dict(one(objs, "Namespace", ns)["metadata"].get("labels", {}))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_driver_namespace_is_privileged(overlay: str) -> None:
    objs = build(overlay)
    for ns in find(objs, "Namespace"):
        name = ns["metadata"]["name"]
        level = ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce")
        assert level == ("privileged" if name == PRIVILEGED_NS else "restricted"), (name, level)
    # The privileged namespace holds the driver and nothing else that runs a pod.
    in_privileged = [k for k, pod in _pod_templates(objs) if pod["metadata"]["namespace"] == PRIVILEGED_NS]
    assert in_privileged == ["DaemonSet/draguard-driver"]
    assert _labels(objs, WEBHOOK_NS)["pod-security.kubernetes.io/warn"] == "restricted"


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    with api_server() as a:
        yield a


def _dry_run_pod(api: Api, pod: dict[str, Any]) -> tuple[bool, str]:
    res = api.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod))
    return res.returncode == 0, res.stderr


def _sync_namespaces(api: Api, objs: Objs) -> None:
    """Create or relabel the bundle's namespaces for real (PodSecurity reads the stored labels), and
    create its ServiceAccounts (a Pod naming a missing one is refused before Pod Security is checked)."""
    for kind in ("Namespace", "ServiceAccount"):
        for obj in find(tuple(objs), kind):
            res = api.kubectl(
                "apply", "--server-side", "--force-conflicts", "--field-manager=psa-test", "-f", "-",
                stdin=yaml.safe_dump(obj),
            )  # fmt: skip
            assert res.returncode == 0, res.stderr


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_api_server_admits_every_pod_under_the_bundle_levels(api: Api, overlay: str) -> None:
    objs = build(overlay)
    _sync_namespaces(api, objs)
    templates = _pod_templates(objs)
    assert {k for k, _ in templates} >= {
        "Deployment/draguard-webhook", "Job/draguard-certs", "CronJob/draguard-certs-renew",
        "DaemonSet/draguard-driver",
    }  # fmt: skip
    for what, pod in templates:
        ok, err = _dry_run_pod(api, pod)
        assert ok, f"{overlay}: {what} refused in {pod['metadata']['namespace']}: {err}"
    # The whole overlay, applied as a user would: the `warn: restricted` label makes the API server
    # check the workload templates too and answer with a warning for any violation.
    res = api.apply_kustomization(
        KUSTOMIZE / "overlays" / overlay, "--dry-run=server", "--server-side", "--force-conflicts",
        "--field-manager=psa-test",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr, res.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_restricted_namespace_refuses_the_driver_pod(api: Api) -> None:
    """The check is real: the driver's privileged pod is refused where the webhook runs."""
    objs = build("local")
    _sync_namespaces(api, objs)
    (driver,) = [p for k, p in _pod_templates(objs) if k == "DaemonSet/draguard-driver"]
    driver["metadata"]["namespace"] = WEBHOOK_NS
    driver["spec"]["serviceAccountName"] = "draguard-webhook"
    ok, err = _dry_run_pod(api, driver)
    assert not ok
    assert 'violates PodSecurity "restricted:latest"' in err and "privileged" in err, err


@pytest.mark.e2e
@pytest.mark.slow
def test_host_network_component_lowers_only_the_webhook_namespace(api: Api) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kustomization.yaml").write_text(
            f"resources:\n  - {os.path.relpath(KUSTOMIZE / 'overlays' / 'eks', tmp)}\n"
            f"components:\n  - {os.path.relpath(KUSTOMIZE / 'components' / 'eks-host-network', tmp)}\n"
        )
        objs = run_build(Path(tmp))
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in find(tuple(objs), "Namespace")}
    assert labels[WEBHOOK_NS]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels[WEBHOOK_NS]["pod-security.kubernetes.io/audit"] == "restricted"
    assert labels["draguard-quota"]["pod-security.kubernetes.io/enforce"] == "restricted"
    try:
        _sync_namespaces(api, objs)
        (webhook,) = [p for k, p in _pod_templates(objs) if k == "Deployment/draguard-webhook"]
        assert webhook["spec"]["hostNetwork"] is True
        ok, err = _dry_run_pod(api, webhook)
        assert ok, err
    finally:
        # Later tests in this module expect the shipped (restricted) labels back.
        _sync_namespaces(api, build("eks"))
    ok, err = _dry_run_pod(api, webhook)
    assert not ok and 'violates PodSecurity "restricted:latest"' in err and "hostNetwork" in err, err
