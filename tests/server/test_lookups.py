"""Admission's reads of what its caches lack (webhook/server/lookups.py): what it asks for, and that a
silent API server costs a request no more than the lookup budget.

The happy path (found, absent) runs against the real kube-apiserver in tests/e2e/test_tier_bypass.py.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from webhook.dra.inventory import Inventory
from webhook.policy.load import load_policies
from webhook.server import lookups
from webhook.server.admission import Snapshot
from webhook.server.caches import KubeHttp

REPO = Path(__file__).resolve().parents[2]


def _snapshot() -> Snapshot:
    return Snapshot(policies=load_policies(REPO / "policies"), inventory=Inventory.empty())


def _claim_request(operation: str = "CREATE", owner: str = "p", namespace: str = "ml") -> dict[str, Any]:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{owner}-gpu-x1",
            "namespace": namespace,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": "u", "controller": True}
            ],
        },
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-a100"}}]}
        },
    }
    return {
        "uid": "r",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
        "operation": operation,
        "namespace": namespace,
        "object": claim,
    }


def _pod_request(template: str, image: str = "vllm/vllm-openai:1") -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {
            "containers": [
                {"name": "c", "image": image, "resources": {"claims": [{"name": "g"}]}}
            ],
            "resourceClaims": [{"name": "g", "resourceClaimTemplateName": template}],
        },
    }
    return {"uid": "r", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
            "namespace": "ml", "object": pod}  # fmt: skip


def test_what_is_looked_up() -> None:
    snap = _snapshot()
    assert lookups.wanted(_claim_request(), snap) == [("Pod", "ml", "p")]
    # A claim's devices never change after creation; kube-system is outside the shipped tier policy.
    assert lookups.wanted(_claim_request("UPDATE"), snap) == []
    assert lookups.wanted(_claim_request(namespace="kube-system"), snap) == []
    assert lookups.wanted(_pod_request("llm-a100"), snap) == [("ResourceClaimTemplate", "ml", "llm-a100")]
    # Names the API server would never hold are not turned into request paths.
    assert lookups.wanted(_claim_request(owner="../../secrets/x"), snap) == []
    assert lookups.wanted(_pod_request("a/b?watch=true"), snap) == []
    assert lookups.wanted(_claim_request(), Snapshot(policies=None)) == []
    # A workload no tier policy classifies needs nothing looked up, whatever it names.
    assert lookups.wanted(_pod_request("llm-a100", image="example.com/batch:1"), snap) == []
    # Nor one whose template the caches hold already.
    held = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "llm-a100", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-a100"}}
        ]}}},
    }  # fmt: skip
    cached = Snapshot(policies=snap.policies, inventory=Inventory.from_objects([held]))
    assert lookups.wanted(_pod_request("llm-a100"), cached) == []
    assert lookups.wanted(_pod_request("other"), cached) == [("ResourceClaimTemplate", "ml", "other")]


@pytest.fixture
def silent_api() -> Iterator[KubeHttp]:
    """A loopback port that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{srv.getsockname()[1]}"
    yield KubeHttp(client.ApiClient(cfg))
    stop.set()
    t.join(2)
    for c in held:
        c.close()
    srv.close()


def test_a_silent_api_server_costs_no_more_than_the_budget(silent_api: KubeHttp) -> None:
    wants = [("ResourceClaimTemplate", "ml", f"t{i}") for i in range(7)] + [("PendingPods", "ml", "c")]
    t0 = time.monotonic()
    got = lookups.fetch(silent_api, wants, _snapshot(), budget=0.5)
    took = time.monotonic() - t0
    assert got.related == ()
    assert got.looked_up == {w: "unreadable" for w in wants}
    # One budget for all eight lookups, the pending-pod list among them (the bound is generous).
    assert took < 2.0, took
