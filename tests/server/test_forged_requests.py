"""Forged or hostile AdmissionReviews against the real request handler: the review cache cannot be
poisoned through the uid, /mutate creates a bounded set of templates within the API server's
deadline, and readiness tells the truth about the caches."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from tests.server.conftest import RecordingCreator, make_webhook, review
from tests.server.objects import legacy_pod_spec, workload
from webhook.server.app import Webhook

MIGRATE = {"team-a": {"draguard.io/migration-mode": "migrate"}}


def llm_deployment(template: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": "team-a", "labels": {"draguard.io/workload-class": "llm"}},
        "spec": {
            "selector": {"matchLabels": {"app": "llm"}},
            "template": {
                "metadata": {"labels": {"app": "llm", "draguard.io/workload-class": "llm"}},
                "spec": {
                    "containers": [
                        {"name": "s", "image": "example.com/llm:1", "resources": {"claims": [{"name": "g"}]}}
                    ],
                    "resourceClaims": [{"name": "g", "resourceClaimTemplateName": template}],
                },
            },
        },
    }


def body_with_uid_first(obj: Mapping[str, Any], uid: str) -> bytes:
    # An UPDATE: what the review cache keeps (a validating CREATE never repeats).
    doc = review(obj, group="apps", kind="Deployment", operation="UPDATE", uid=uid)
    req = doc["request"]
    doc["request"] = {"uid": req.pop("uid"), **req}  # the uid first, as the API server encodes it
    return json.dumps(doc).encode()


async def test_a_uid_repeated_in_the_body_cannot_poison_the_review_cache(
    policy_dir: Callable[[str], Path],
) -> None:
    wh = make_webhook(policy_dir("enforce"))
    async with TestClient(TestServer(wh.build_app())) as c:
        # The forger's uid also ends the template name: removing the uid text from this body
        # gives the bytes of the real request below with its uid removed.
        forged = body_with_uid_first(llm_deployment("one-a100Zq9"), "Zq9")
        r = await c.post("/validate", data=forged, headers={"Content-Type": "application/json"})
        assert (await r.json())["response"]["allowed"] is True  # an unknown template: not judged
        real = body_with_uid_first(llm_deployment("one-a100"), "a1b2c3")
        r = await c.post("/validate", data=real, headers={"Content-Type": "application/json"})
        resp = (await r.json())["response"]
        assert resp["uid"] == "a1b2c3"
        assert resp["allowed"] is False and "[tier/gpu-tiers]" in resp["status"]["message"]
        # An identical request under another uid is still answered from the cache.
        again = body_with_uid_first(llm_deployment("one-a100"), "d4e5f6")
        r = await c.post("/validate", data=again, headers={"Content-Type": "application/json"})
        resp = (await r.json())["response"]
        assert resp["uid"] == "d4e5f6" and resp["allowed"] is False
    assert wh.review_cache is not None and wh.review_cache.hits == 1


def legacy_pod(gpus: int) -> dict[str, Any]:
    spec = legacy_pod_spec()
    spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    return workload("Pod", spec)


async def mutate(wh: Webhook, obj: dict[str, Any]) -> dict[str, Any]:
    async with TestClient(TestServer(wh.build_app())) as c:
        r = await c.post("/mutate", json=review(obj))
        assert r.status == 200
        resp: dict[str, Any] = (await r.json())["response"]
        return resp


async def test_mutate_makes_no_template_for_more_devices_than_a_node_has(
    policy_dir: Callable[[str], Path],
) -> None:
    creator = RecordingCreator()
    wh = make_webhook(policy_dir("enforce"), creator=creator, labels=MIGRATE)
    most = max(
        sum(1 for d in wh.snapshot.inventory.devices if d.node == n) for n in wh.snapshot.inventory.nodes()
    )
    resp = await mutate(wh, legacy_pod(most))
    assert resp.get("patch") and len(creator.made) == 1
    # The count is the sender's to choose; one template per count would be unbounded.
    for n in (most + 1, 1000, 99999):
        resp = await mutate(wh, legacy_pod(n))
        assert "patch" not in resp and "more than any node has" in resp["warnings"][0]
    assert len(creator.made) == 1


class SlowCreator:
    """An API server that takes longer than the webhook may wait."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    def ensure(self, tmpl: Mapping[str, Any], timeout: float) -> str:
        self.calls += 1
        assert timeout <= 1.5
        self.release.wait(10)
        return "created"


async def test_mutate_answers_within_its_deadline_when_the_api_server_is_slow(
    policy_dir: Callable[[str], Path],
) -> None:
    creator = SlowCreator()
    wh = make_webhook(policy_dir("enforce"), creator=creator, labels=MIGRATE)
    spec = legacy_pod_spec()
    spec["containers"].append(copy.deepcopy(spec["containers"][0]) | {"name": "second"})
    spec["containers"][1]["resources"]["limits"]["nvidia.com/gpu"] = "2"  # a second template
    t0 = time.perf_counter()
    try:
        resp = await mutate(wh, workload("Pod", spec))
    finally:
        creator.release.set()
    took = time.perf_counter() - t0
    # The bundle's mutating webhook times out after 2 s; the answer comes well before.
    assert took < 1.9, took
    assert "patch" not in resp and "not migrated" in resp["warnings"][0]
    assert creator.calls == 1  # the second template is not even tried once the time is spent


async def test_readiness_waits_for_synced_caches_and_drops_when_a_watch_breaks(
    policy_dir: Callable[[str], Path],
) -> None:
    from webhook.server.caches import ClusterCache
    from webhook.server.metrics import Metrics

    wh = make_webhook(policy_dir("enforce"))
    wh.caches_synced = False
    cache = ClusterCache(http=None, metrics=Metrics(), dra_version="v1", served=frozenset({"v1"}))  # type: ignore[arg-type]
    wh.cache = cache
    async with TestClient(TestServer(wh.build_app())) as c:
        r = await c.get("/readyz")
        assert r.status == 503 and "caches not synced" in await r.text()
        for refl in cache.reflectors.values():
            refl.synced = True
        wh.caches_synced = True
        assert (await c.get("/readyz")).status == 200
        # A watch that fails and keeps failing: fine for a while (reconnects are normal) ...
        refl = cache.reflectors["resourceclaims"]
        refl.broken_since = time.monotonic() - 5
        assert (await c.get("/readyz")).status == 200
        # ... unready once it has been broken longer than the bound.
        refl.broken_since = time.monotonic() - wh.opts.watch_stale_after - 1
        r = await c.get("/readyz")
        assert r.status == 503 and "resourceclaims" in await r.text()
        refl.broken_since = None
        assert (await c.get("/readyz")).status == 200


def test_a_template_with_alternatives_counts_its_largest_choice() -> None:
    """A generated template's device count is bounded by the largest count the scheduler may pick, so
    a `firstAvailable` list cannot slip a hostile count past the per-node limit."""
    from webhook.server.app import _template_devices

    def tmpl(*requests: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"spec": {"devices": {"requests": list(requests)}}}}

    assert _template_devices(tmpl({"name": "g", "exactly": {"count": 4}})) == 4
    either = [{"name": "nvlink", "count": 2}, {"name": "any", "count": 99999}]
    choices = {"name": "g", "firstAvailable": either}
    assert _template_devices(tmpl(choices)) == 99999
    assert _template_devices(tmpl(choices, {"name": "h", "exactly": {}})) == 100000
    # Shapes a forged request may carry: never an error, never less than one per request.
    assert _template_devices(tmpl({"name": "g", "firstAvailable": [None, {"count": "lots"}]})) == 1
    assert _template_devices(tmpl({"name": "g", "firstAvailable": []}, "junk")) == 1  # type: ignore[arg-type]
