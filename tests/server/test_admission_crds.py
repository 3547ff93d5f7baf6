"""Workload CRDs through the real /validate endpoint: their pod templates are checked like a Pod's."""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from tests.server.conftest import make_webhook, review

SHIPPED = Path(__file__).resolve().parents[2] / "policies"


def _pytorchjob(workers: int) -> dict[str, object]:
    pod = {"spec": {"containers": [{"name": "t", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                                    "resources": {"limits": {"nvidia.com/gpu": 8}}}]}}  # fmt: skip
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers, "template": pod}}},
    }


async def test_pytorchjob_over_budget_is_denied_and_within_is_allowed() -> None:
    wh = make_webhook(SHIPPED)
    async with TestClient(TestServer(wh.build_app())) as c:
        over = await c.post("/validate", json=review(_pytorchjob(4), group="kubeflow.org", kind="PyTorchJob"))
        resp = (await over.json())["response"]
        assert resp["allowed"] is False
        assert "quota/team-budgets" in resp["status"]["message"] and "PyTorchJob" in resp["status"]["message"]
        ok = await c.post("/validate", json=review(_pytorchjob(1), group="kubeflow.org", kind="PyTorchJob"))
        assert (await ok.json())["response"]["allowed"] is True
