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
from webhook.server import admission, lookups
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
    http = KubeHttp(client.ApiClient(cfg))
    http.accepted = held  # type: ignore[attr-defined]  # the connections made to it
    yield http
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


def test_a_review_naming_another_namespace_reads_nothing() -> None:
    """A forged review: the request says one namespace, its object another. The API server makes the
    two equal, so nothing is read on behalf of such a request."""
    snap = _snapshot()
    for req in (_claim_request(), _pod_request("llm-a100")):
        req["object"]["metadata"]["namespace"] = "victims"
        assert lookups.wanted(req, snap) == []
        del req["object"]["metadata"]["namespace"]
        assert lookups.wanted(req, snap) == []
    bad_ns = _claim_request()
    bad_ns["namespace"] = bad_ns["object"]["metadata"]["namespace"] = "../../api"
    assert lookups.wanted(bad_ns, snap) == []


def test_a_namespace_the_watch_does_not_know_is_not_read(silent_api: KubeHttp) -> None:
    """A namespace the watch has not seen (made up by the sender, or just created) is unreadable
    without a request to the API server; the rule then fails closed."""
    snap = Snapshot(policies=_snapshot().policies, inventory=Inventory.empty(),
                    namespace_labels={"ml": {}})  # fmt: skip
    wants = [("Pod", "elsewhere", "p"), ("PendingPods", "elsewhere", "c")]
    got = lookups.fetch(silent_api, wants, snap, budget=5.0)
    assert got.looked_up == {w: "unreadable" for w in wants}
    assert silent_api.accepted == []  # type: ignore[attr-defined]


def test_path_segments_are_quoted() -> None:
    assert lookups._path("Pod", "ml", "a/../../healthz", frozenset()) == (
        "/api/v1/namespaces/ml/pods/a%2F..%2F..%2Fhealthz"
    )
    assert lookups._path("ResourceClaimTemplate", "m?l", "t#x", frozenset({"v1"})) == (
        "/apis/resource.k8s.io/v1/namespaces/m%3Fl/resourceclaimtemplates/t%23x"
    )


def test_the_answer_never_quotes_what_was_read_for_it() -> None:
    """A claim naming another tenant's pod as its owner is judged by that pod's class, but the answer
    does not carry the pod's image, command or labels (the review may be forged to learn them)."""
    snap = _snapshot()
    req = _claim_request()
    image = "registry.victim.example/vllm/vllm-openai:secret-tag"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "labels": {"app": "secret-app-name"},
                     "annotations": {"note": "secret-annotation"}},
        "spec": {"containers": [{"name": "c", "image": image,
                                 "command": ["python", "-m", "vllm.entrypoints.openai.api_server"],
                                 "args": ["--model /models/secret-model"]}]},
    }  # fmt: skip
    out = admission.review("validate", req, snap, None, lookups.Lookups((pod,), {}))
    assert out.verdict == "denied"  # the pod's image makes it an llm workload: A100 is refused
    message = out.response["status"]["message"]
    assert "class 'llm'" in message and "tier/gpu-tiers" in message and "gpu.nvidia.com-a100" in message
    for secret in ("secret-tag", "victim.example", "secret-app-name", "secret-annotation", "secret-model"):
        assert secret not in message, secret
    assert lookups.HIDDEN in message
    # The findings themselves (logs, metrics) keep the facts; only the answer to the sender hides them.
    assert any(image in f.message for f in out.findings)
