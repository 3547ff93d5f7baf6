"""The admission path's JSON (orjson) reads and writes what the standard library does, and refuses
hostile bodies with a 400 and a reason."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.server.conftest import make_webhook, review
from tests.server.objects import legacy_pod_spec, workload
from webhook.server import admission, codec
from webhook.server.admission import ReviewError

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_reads_and_writes_what_the_standard_library_does(value: Any) -> None:
    text = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "x": value})
    assert codec.loads(text.encode()) == json.loads(text)
    assert json.loads(codec.dumps(value)) == value


def _nest(depth: int) -> Any:
    v: Any = "leaf"
    for _ in range(depth):
        v = {"a": v}
    return v


def test_values_orjson_cannot_write_fall_back_to_the_standard_library() -> None:
    for value in (_nest(400), {"n": 2**70}, {1: "int key"}):
        assert json.loads(codec.dumps(value)) == json.loads(json.dumps(value))


HEAD = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (HEAD + b"[" * 1100 + b"]" * 1100 + b"}", "too-deep"),
        (HEAD + b'{"uid":"u","x":NaN}}', "malformed-json"),
        (HEAD + b'{"uid":"\\ud800"}}', "malformed-json"),
        (HEAD + b'{"uid":"u","x":1e400}}', "malformed-json"),
        (HEAD + b'{"uid":"u","x":Infinity}}', "malformed-json"),
    ],
)
def test_hostile_bodies_are_refused_with_a_reason(body: bytes, reason: str) -> None:
    with pytest.raises(ReviewError) as e:
        admission.parse_review(body)
    assert (e.value.status, e.value.reason) == (400, reason)


def test_review_cache_key_ignores_only_the_uid() -> None:
    obj = workload("Pod", legacy_pod_spec())
    # UPDATEs: what repeats on /validate (a server-side apply that changes nothing).
    a = admission.parse_review(json.dumps(review(obj, operation="UPDATE", uid="one")).encode())
    b = admission.parse_review(json.dumps(review(obj, operation="UPDATE", uid="two")).encode())
    other = admission.parse_review(
        json.dumps(review({**obj, "metadata": {"name": "x"}}, operation="UPDATE", uid="one")).encode()
    )
    key = admission.ReviewCache.key
    assert key("validate", a, 1) == key("validate", b, 1)
    assert key("validate", a, 1) != key("validate", other, 1)
    assert key("validate", a, 1) != key("mutate", a, 1)
    # A validating CREATE never repeats (a fresh uid and creationTimestamp each time): no key.
    create = admission.parse_review(json.dumps(review(obj, uid="one")).encode())
    assert key("validate", create, 1) is None and key("mutate", create, 1) is not None


@pytest.fixture
async def client(policy_dir: Callable[[str], Path]) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(make_webhook(policy_dir("enforce")).build_app())) as c:
        yield c


async def test_a_non_ascii_review_round_trips_through_the_server(client: TestClient[Any, Any]) -> None:
    obj = workload("Pod", legacy_pod_spec())
    obj["metadata"]["annotations"] = {"note": "GPU 推論 \u2028 é"}
    r = await client.post("/validate", data=json.dumps(review(obj, uid="ü-1")).encode())
    assert r.status == 200
    doc = json.loads(await r.read())
    assert doc["response"]["uid"] == "ü-1"
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
