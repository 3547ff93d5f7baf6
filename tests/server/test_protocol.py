"""Bad input at the HTTP boundary: clear 4xx answers, never a 500; hypothesis fuzzing of both endpoints."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.conftest import make_webhook, review
from tests.server.objects import legacy_pod_spec, workload
from webhook.server.app import Webhook


@pytest.fixture
async def client(policy_dir: Callable[[str], Path]) -> AsyncIterator[TestClient[Any, Any]]:
    wh = make_webhook(policy_dir("enforce"))
    async with TestClient(TestServer(wh.build_app())) as c:
        c.webhook = wh  # type: ignore[attr-defined]
        yield c


@pytest.mark.parametrize(
    ("body", "reason", "text"),
    [
        (b"{not json", "malformed-json", "not valid JSON"),
        (b"[]", "not-a-review", "JSON object"),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}}
            ).encode(),
            "unsupported-version",
            "admission.k8s.io/v1",
        ),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}).encode(),
            "not-a-review",
            "AdmissionReview",
        ),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
            "missing-request",
            "no request",
        ),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"kind": {}}}
            ).encode(),
            "missing-uid",
            "request.uid",
        ),
        (b"\xff\xfe\x00garbage", "malformed-json", "not valid JSON"),
    ],
)
@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
async def test_bad_requests_get_400_with_reason(
    client: TestClient[Any, Any], endpoint: str, body: bytes, reason: str, text: str
) -> None:
    r = await client.post(f"/{endpoint}", data=body, headers={"Content-Type": "application/json"})
    assert r.status == 400
    doc = await r.json()
    assert doc["reason"] == reason and text in doc["error"]
    metrics = await (await client.get("/metrics")).text()
    assert f'draguard_admission_bad_requests_total{{reason="{reason}"}} 1.0' in metrics


@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
async def test_body_over_3_mib_is_413(client: TestClient[Any, Any], endpoint: str) -> None:
    obj = workload("Pod", legacy_pod_spec())
    obj["metadata"]["annotations"] = {"big": "x" * (3 * 1024 * 1024)}
    r = await client.post(f"/{endpoint}", data=json.dumps(review(obj)).encode())
    assert r.status == 413
    # Just under the limit is fine.
    obj["metadata"]["annotations"] = {"big": "x" * (3 * 1024 * 1024 - 4096)}
    r = await client.post(f"/{endpoint}", data=json.dumps(review(obj)).encode())
    assert r.status == 200


async def test_health_and_readiness(policy_dir: Callable[[str], Path]) -> None:
    wh = make_webhook(policy_dir("enforce"))
    async with TestClient(TestServer(wh.build_app())) as c:
        assert (await c.get("/healthz")).status == 200
        assert (await c.get("/readyz")).status == 200
        wh.caches_synced = False
        r = await c.get("/readyz")
        assert r.status == 503 and "caches not synced" in await r.text()
        wh.caches_synced = True
        wh.draining = True
        r = await c.get("/readyz")
        assert r.status == 503 and "shutting down" in await r.text()


async def test_not_ready_without_valid_policies(tmp_path: Path) -> None:
    bad = tmp_path / "p"
    bad.mkdir()
    (bad / "x.yaml").write_text(
        "apiVersion: policy.draguard.io/v1alpha1\nkind: GpuTierPolicy\n"
        "metadata: {name: t}\nspec: {mode: sometimes}\n"
    )
    from webhook.server.app import ServeOptions

    wh = Webhook(ServeOptions(policies=str(bad), no_watch=True))
    assert not wh.load_policies(first=True)
    wh.caches_synced = True
    async with TestClient(TestServer(wh.build_app())) as c:
        r = await c.get("/readyz")
        text = await r.text()
        assert r.status == 503 and "x.yaml" in text
        r = await c.post("/validate", json=review(workload("Pod", legacy_pod_spec())))
        assert r.status == 503


# What the API server can send: finite numbers, integers within int64 (NaN, Infinity and bigger
# integers are refused as malformed JSON: tests/server/test_codec.py).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
KINDS = st.sampled_from(
    [
        ("", "v1", "Pod"),
        ("apps", "v1", "Deployment"),
        ("batch", "v1", "CronJob"),
        ("resource.k8s.io", "v1", "ResourceClaim"),
        ("resource.k8s.io", "v1beta1", "ResourceClaimTemplate"),
        ("resource.k8s.io", "v1beta2", "DeviceClass"),
        ("", "v1", "Secret"),
    ]
)


def _mutated_object(base: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    obj = json.loads(json.dumps(base))
    cur: Any = obj
    for key in path[:-1]:
        if not isinstance(cur, dict):
            return obj
        cur = cur.setdefault(key, {})
    if isinstance(cur, dict) and path:
        cur[path[-1]] = value
    return obj


FUZZ_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ_SETTINGS
@given(body=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
async def test_fuzz_arbitrary_bodies_never_500(client: TestClient[Any, Any], body: bytes) -> None:
    for ep in ("validate", "mutate"):
        r = await client.post(f"/{ep}", data=body)
        assert r.status in (200, 400), (r.status, body)


@FUZZ_SETTINGS
@given(
    kind=KINDS,
    path=st.lists(
        st.sampled_from(
            [
                "spec",
                "metadata",
                "containers",
                "devices",
                "requests",
                "template",
                "resources",
                "resourceClaims",
                "selectors",
                "labels",
                "0",
                "exactly",
            ]
        ),
        min_size=1,
        max_size=5,
    ),
    value=json_values,
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", "", "PATCH"]),
    dry_run=st.booleans(),
)
async def test_fuzz_reviews_always_answer(
    client: TestClient[Any, Any],
    kind: tuple[str, str, str],
    path: list[str],
    value: Any,
    operation: str,
    dry_run: bool,
) -> None:
    group, version, k = kind
    base = workload("Pod", legacy_pod_spec())
    obj = _mutated_object(base, path, value)
    body = review(
        obj, group=group, version=version, kind=k, operation=operation, uid="fuzz-1", dry_run=dry_run
    )
    for ep in ("validate", "mutate"):
        r = await client.post(f"/{ep}", json=body)
        assert r.status == 200
        doc = await r.json()
        assert doc["response"]["uid"] == "fuzz-1" and isinstance(doc["response"]["allowed"], bool)
        for w in doc["response"].get("warnings", []):
            assert len(w) <= 120
