"""One charging rule: for every claim shape a ResourceQuota can judge, the rendered native quota on the
real API server and draguard's quota rule give the same verdict (README "How claims are charged")."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.helpers import Kubectl, wait_for
from webhook.core.findings import Mode
from webhook.core.source import SourceObject
from webhook.dev import scenarios
from webhook.dev.cluster import REPO_ROOT, LocalCluster
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.load import load_policies

A100, H100 = scenarios.A100, scenarios.H100


def _exact(cls: str, count: int | None = None, mode: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls}
    if count is not None:
        body["count"] = count
    if mode is not None:
        body["allocationMode"] = mode
    return body


SHAPES: dict[str, list[dict[str, Any]]] = {
    "8 A100 (the budget)": [{"name": "g", "exactly": _exact(A100, 8)}],
    "9 A100": [{"name": "g", "exactly": _exact(A100, 9)}],
    "All A100 (charged 32)": [{"name": "g", "exactly": _exact(A100, mode="All")}],
    "1 H100 or 2 A100": [{"name": "g", "firstAvailable": [
        {"name": "h", **_exact(H100, 1)}, {"name": "a", **_exact(A100, 2)}]}],
    "1 H100 or 9 A100 (each class its largest)": [{"name": "g", "firstAvailable": [
        {"name": "h", **_exact(H100, 1)}, {"name": "a", **_exact(A100, 9)}]}],
    "two requests, 5 + 4 A100": [
        {"name": "a", "exactly": _exact(A100, 5)}, {"name": "b", "exactly": _exact(A100, 4)}],
}  # fmt: skip


def claim(ns: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "shape", "namespace": ns},
        "spec": {"devices": {"requests": requests}},
    }


def draguard_denies(obj: dict[str, Any]) -> bool:
    """The quota rule's class-budget verdict for a team-* namespace, offline, from the shipped policies."""
    policies = load_policies(REPO_ROOT / "policies")
    report = evaluate([SourceObject(obj)], policies, Inventory.empty(), Context(), rule_modules=("quota",))
    return any(
        f.mode is Mode.ENFORCE and "devices of class" in f.message for f in report.findings
    )


@pytest.fixture
def webhook_bypassed(cluster: LocalCluster, kubectl: Kubectl) -> Iterator[None]:
    port = (cluster.state.get("ports") or {}).get("webhook")
    kubectl.ok("delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", "draguard",
               "--ignore-not-found")  # fmt: skip
    try:
        yield
    finally:
        if port:
            cluster.register_webhook(int(port))


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_native_quota_and_draguard_agree(
    shape: str, kubectl: Kubectl, namespace: Callable[..., str], webhook_bypassed: None
) -> None:
    ns = namespace("team")
    rendered = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "quota", "render", "--policies", str(REPO_ROOT / "policies"),
         "--namespace", ns],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT,
    ).stdout  # fmt: skip
    assert kubectl.apply(rendered).returncode == 0
    name = next(d for d in yaml.safe_load_all(rendered) if d)["metadata"]["name"]
    wait_for(lambda: kubectl.get("resourcequota", name, ns).get("status", {}).get("hard"),
             "the quota controller to fill in the quota's status")  # fmt: skip

    obj = claim(ns, SHAPES[shape])
    native = kubectl.apply(yaml.safe_dump(obj))
    native_denied = native.returncode != 0
    if native_denied:
        assert "exceeded quota" in native.stderr, native.stderr
    assert native_denied == draguard_denies(obj), (shape, native.stderr)
