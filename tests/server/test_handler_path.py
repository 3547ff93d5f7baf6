"""The admission handler's cheap paths keep what users rely on: the per-review log line, the
metrics, the client-name check and the body timeout."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from aiohttp import streams, web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from tests.server.conftest import make_webhook, review
from tests.server.objects import legacy_pod_spec, tier_pod_spec, workload
from webhook.server import app as app_module
from webhook.server import logs


def test_log_time_matches_isoformat_across_second_and_day_boundaries() -> None:
    for ns in (
        0,
        999_999_999,
        1_000_000_000,
        1_764_633_599_999_999_999,  # the last nanosecond of a day
        1_764_633_600_000_000_000,
        1_764_633_600_000_500_000,
        1_764_633_600_001_000_000,
        1_764_633_600_999_999_999,
    ):
        expected = dt.datetime.fromtimestamp(ns // 1000 / 1e6, dt.UTC).isoformat(timespec="milliseconds")
        assert logs.utc_millis(ns) == expected, ns


async def test_fast_log_line_has_the_formatters_fields_in_its_order(
    policy_dir: Callable[[str], Path],
) -> None:
    stream = io.StringIO()
    logs.setup("info", stream)
    root = logging.getLogger()
    try:
        wh = make_webhook(policy_dir("enforce"))
        async with TestClient(TestServer(wh.build_app())) as c:
            obj = workload("Pod", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
            assert (await c.post("/validate", json=review(obj, uid="fast-1"))).status == 200
            # A second handler: the line goes through LogRecord and JsonFormatter instead.
            other = io.StringIO()
            extra = logging.StreamHandler(other)
            extra.setFormatter(logs.JsonFormatter())
            root.addHandler(extra)
            assert (await c.post("/validate", json=review(obj, uid="slow-1"))).status == 200
    finally:
        root.handlers.clear()
    fast = next(json.loads(x) for x in stream.getvalue().splitlines() if '"uid":"fast-1"' in x)
    slow = next(json.loads(x) for x in other.getvalue().splitlines() if '"uid":"slow-1"' in x)
    assert list(fast) == list(slow)
    assert list(fast)[:4] == ["time", "level", "logger", "msg"]
    assert fast["verdict"] == slow["verdict"] == "denied" and fast["rules"] == ["tier/gpu-tiers"]
    assert fast["level"] == "info" and fast["object"] == "Pod/team-a/w"
    stamp = dt.datetime.fromisoformat(fast["time"])
    assert stamp.utcoffset() == dt.timedelta(0)
    assert abs((dt.datetime.now(dt.UTC) - stamp).total_seconds()) < 60


async def test_metrics_per_kind_operation_and_verdict_stay_apart(policy_dir: Callable[[str], Path]) -> None:
    wh = make_webhook(policy_dir("warn"))
    tier = workload("Pod", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    async with TestClient(TestServer(wh.build_app())) as c:
        for body in (
            review(tier),
            review(tier, operation="UPDATE"),
            review(tier, operation="UPDATE"),
            review(tier, operation="DELETE"),
            review(workload("Pod", legacy_pod_spec()), kind="Evil\nKind", operation="PATCHY"),
        ):
            assert (await c.post("/validate", json=body)).status == 200
        text = (await (await c.get("/metrics")).read()).decode()
    assert (
        'draguard_admission_requests_total{endpoint="validate",kind="Pod",operation="CREATE",'
        'verdict="warned"} 1.0' in text
    )
    assert (
        'draguard_admission_requests_total{endpoint="validate",kind="Pod",operation="UPDATE",'
        'verdict="warned"} 2.0' in text
    )
    assert (
        'draguard_admission_requests_total{endpoint="validate",kind="Pod",operation="DELETE",'
        'verdict="ignored"} 1.0' in text
    )
    assert 'draguard_admission_ignored_total{endpoint="validate",kind="Pod",operation="DELETE"} 1.0' in text
    # What the caller names is not a label value: it is counted as "other".
    assert (
        'draguard_admission_ignored_total{endpoint="validate",kind="other",operation="other"} 1.0' in text
    )
    assert "Evil" not in text and "PATCHY" not in text
    assert 'draguard_admission_duration_seconds_count{endpoint="validate"} 5.0' in text
    # The second identical UPDATE is answered from the review cache.
    assert 'draguard_review_cache_total{result="hit"} 1.0' in text
    assert 'draguard_review_cache_total{result="miss"} 4.0' in text
    assert 'draguard_findings_total{endpoint="validate",mode="warn",rule="tier/gpu-tiers"} 3.0' in text


async def test_client_names_still_checked_on_every_request(policy_dir: Callable[[str], Path]) -> None:
    wh = make_webhook(policy_dir("enforce"))
    wh.opts.client_names = ("kube-apiserver",)
    async with TestClient(TestServer(wh.build_app())) as c:
        r = await c.post("/validate", json=review(workload("Pod", legacy_pod_spec())))
        assert r.status == 403 and (await r.json())["reason"] == "client-name"
        assert (await c.get("/healthz")).status == 403
    assert 'draguard_admission_bad_requests_total{reason="client-name"} 2.0' in wh.metrics.render().decode()


async def test_a_body_sent_after_the_headers_is_still_bounded_by_the_body_timeout(
    policy_dir: Callable[[str], Path],
) -> None:
    wh = make_webhook(policy_dir("enforce"))
    wh.opts.body_timeout = 0.5
    body = json.dumps(review(workload("Pod", legacy_pod_spec()))).encode()
    head = (
        b"POST /validate HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    async with TestServer(wh.build_app()) as server:
        # Headers first, the body later and complete: answered (the timer ran, it did not fire).
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(head)
        await writer.drain()
        await asyncio.sleep(0.1)  # lets the server start the handler before any body byte arrives
        writer.write(body)
        answer = await asyncio.wait_for(reader.read(65536), 10)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        writer.close()
        # Headers and part of the body, the rest never: 408 after the body timeout.
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(head + body[:10])
        await writer.drain()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        answer = await asyncio.wait_for(reader.read(65536), 10)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"body-timeout" in answer
        assert 0.4 < loop.time() - t0 < 5.0
        writer.close()


def test_counts_reach_every_reader_of_the_registry_and_the_memo_stays_bounded() -> None:
    from webhook.server.metrics import MAX_MEMOISED, Metrics

    m = Metrics()
    for _ in range(3):
        m.answered("validate", "Pod", "CREATE", "denied").requests.add()
        m.found("tier/gpu-tiers", "enforce", "validate").add()
    m.review_cache_miss.add()
    # Not only /metrics: any read of the registry sees what was counted.
    labels = {"endpoint": "validate", "kind": "Pod", "operation": "CREATE", "verdict": "denied"}
    assert m.registry.get_sample_value("draguard_admission_requests_total", labels) == 3.0
    assert m.registry.get_sample_value("draguard_review_cache_total", {"result": "miss"}) == 1.0
    m.found("tier/gpu-tiers", "enforce", "validate").add()
    found = {"rule": "tier/gpu-tiers", "mode": "enforce", "endpoint": "validate"}
    assert m.registry.get_sample_value("draguard_findings_total", found) == 4.0
    # Past the memo's bound every increment still counts, straight to its counter.
    for i in range(MAX_MEMOISED + 10):
        m.found(f"rule-{i}", "warn", "validate").add()
    m.found(f"rule-{MAX_MEMOISED + 5}", "warn", "validate").add()
    late = {"rule": f"rule-{MAX_MEMOISED + 5}", "mode": "warn", "endpoint": "validate"}
    assert m.registry.get_sample_value("draguard_findings_total", late) == 2.0
    assert len(m._found) <= MAX_MEMOISED and len(m._tallies) <= 4 * MAX_MEMOISED


async def test_a_chunked_body_is_size_checked_and_answered(policy_dir: Callable[[str], Path]) -> None:
    from webhook.server.app import MAX_BODY

    wh = make_webhook(policy_dir("enforce"))
    body = json.dumps(review(workload("Pod", legacy_pod_spec()))).encode()

    def chunked(data: bytes, size: int = 64 * 1024) -> bytes:
        parts = [f"{len(data[i : i + size]):x}\r\n".encode() + data[i : i + size] + b"\r\n"
                 for i in range(0, len(data), size)]  # fmt: skip
        return (
            b"POST /validate HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(parts) + b"0\r\n\r\n"
        )

    async with TestServer(wh.build_app()) as server:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(chunked(body))
        answer = await asyncio.wait_for(reader.read(65536), 10)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert b'"allowed":true' in answer
        writer.close()
        # Over 3 MiB without a Content-Length: refused, whether or not it was all buffered.
        big = json.dumps({"apiVersion": "admission.k8s.io/v1", "pad": "x" * (MAX_BODY + 10)}).encode()
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(chunked(big))
        answer = await asyncio.wait_for(reader.read(65536), 10)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"too-large" in answer
        writer.close()


def test_tallied_histogram_is_exposed_as_prometheus_clients_own() -> None:
    import re

    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from webhook.server.metrics import LATENCY_BUCKETS, TalliedHistogram

    ours_registry = CollectorRegistry(auto_describe=True)
    theirs_registry = CollectorRegistry(auto_describe=True)
    ours = TalliedHistogram("x_duration_seconds", "Time to answer", ["endpoint"], buckets=LATENCY_BUCKETS)
    ours_registry.register(ours)
    theirs = Histogram(
        "x_duration_seconds", "Time to answer", ["endpoint"], buckets=LATENCY_BUCKETS,
        registry=theirs_registry,
    )  # fmt: skip
    # Bounds themselves, between them, zero, past the last bound; two children in first-seen order.
    values = [*LATENCY_BUCKETS, 0.0, 0.0003, 0.0007, 0.003, 0.7, 11.0, 1e6]
    for endpoint in ("validate", "mutate"):
        for v in values:
            ours.labels(endpoint).observe(v)
            theirs.labels(endpoint).observe(v)
        values = values[::3]

    def text(registry: CollectorRegistry) -> str:
        return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", generate_latest(registry).decode())

    assert text(ours_registry) == text(theirs_registry)
    assert "_created" in text(ours_registry)
    bucket = {"endpoint": "validate", "le": "0.001"}
    got = ours_registry.get_sample_value("x_duration_seconds_bucket", bucket)
    assert got == theirs_registry.get_sample_value("x_duration_seconds_bucket", bucket) == 5.0


async def test_bookkeeping_runs_after_the_answer_is_written_and_once(
    policy_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics and the log line of a review are recorded once the answer's bytes are handed to
    the transport (the API server does not wait for them), exactly once per review."""
    wh = make_webhook(policy_dir("warn"))
    order: list[str] = []
    plain_write_eof = web.Response.write_eof
    plain_account = wh._safe_account

    async def write_eof(self: web.Response, data: bytes = b"") -> None:
        await plain_write_eof(self, data)
        order.append("written")

    def account(*a: Any, **k: Any) -> None:
        order.append("accounted")
        plain_account(*a, **k)

    monkeypatch.setattr(web.Response, "write_eof", write_eof)
    monkeypatch.setattr(wh, "_safe_account", account)
    tier = workload("Pod", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    async with TestClient(TestServer(wh.build_app())) as c:
        assert (await c.post("/validate", json=review(tier, uid="after-1"))).status == 200
        # The same review again: an UPDATE, the second time answered from the review cache.
        for uid in ("after-2", "after-3"):
            assert (await c.post("/validate", json=review(tier, uid=uid, operation="UPDATE"))).status == 200
        await asyncio.sleep(0)  # the fallback turn, which must not count any review twice
        text = (await (await c.get("/metrics")).read()).decode()
    assert order == ["written", "accounted"] * 3 + ["written"]  # the last: /metrics, no review
    assert 'draguard_admission_duration_seconds_count{endpoint="validate"} 3.0' in text
    assert 'draguard_review_cache_total{result="hit"} 1.0' in text


async def test_bookkeeping_runs_when_the_answer_is_never_written(policy_dir: Callable[[str], Path]) -> None:
    """A client gone before its answer is written still leaves its review counted (on the loop's
    next turn), and a write that fails counts it too."""
    wh = make_webhook(policy_dir("warn"))
    tier = workload("Pod", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    body = json.dumps(review(tier, uid="gone")).encode()
    payload = streams.StreamReader(mock.Mock(), 2**16, loop=asyncio.get_running_loop())
    payload.feed_data(body)
    payload.feed_eof()
    headers = {"Content-Length": str(len(body)), "Content-Type": "application/json"}
    req = make_mocked_request("POST", "/validate", headers=headers, payload=payload)
    resp = await wh._validate(req)
    assert resp.status == 200
    count = 'draguard_admission_duration_seconds_count{endpoint="validate"}'
    assert count not in wh.metrics.render().decode()
    await asyncio.sleep(0)
    assert f"{count} 1.0" in wh.metrics.render().decode()

    seen: list[int] = []
    failing = app_module._Answer(b"{}", lambda: seen.append(1))

    async def broken(self: web.Response, data: bytes = b"") -> None:
        raise ConnectionResetError

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(web.Response, "write_eof", broken)
        with pytest.raises(ConnectionResetError):
            await failing.write_eof()
    failing.settle()
    assert seen == [1]
