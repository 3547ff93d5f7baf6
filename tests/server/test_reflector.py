"""Reflector behaviour on the watch protocol's error paths: 410 Gone, dropped streams, bookmarks.

The API server here is a small loopback HTTP server speaking the list/watch protocol, because a real
kube-apiserver cannot be made to compact or drop a watch on demand; the happy path runs against the
real one in test_e2e_caches.py.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from webhook.server.caches import KubeHttp, Reflector, Resource, watch_lines
from webhook.server.metrics import Metrics


def ns(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv)}}


class Api:
    """Scripted list/watch answers: `watches` is consumed one script per watch request."""

    def __init__(self) -> None:
        self.lists = 0
        self.items = [ns("a", 10), ns("b", 11)]
        self.rv = 11
        self.watches: list[list[Any]] = []
        self.watch_rvs: list[str] = []
        self.closing = False

    async def handle(self, req: web.Request) -> web.StreamResponse:
        if req.query.get("watch") != "true":
            self.lists += 1
            return web.json_response(
                {"kind": "NamespaceList", "metadata": {"resourceVersion": str(self.rv)}, "items": self.items}
            )
        self.watch_rvs.append(req.query.get("resourceVersion", ""))
        script = self.watches.pop(0) if self.watches else ["hang"]
        if script == ["http410"]:
            return web.json_response({"kind": "Status", "code": 410, "reason": "Expired"}, status=410)
        resp = web.StreamResponse()
        await resp.prepare(req)
        for ev in script:
            if ev == "hang":
                import asyncio

                while not self.closing:  # an idle watch, until the test ends
                    await asyncio.sleep(0.05)
                break
            await resp.write(json.dumps(ev).encode() + b"\n")
        return resp


@pytest.fixture
def api() -> Iterator[tuple[Api, KubeHttp]]:
    import asyncio

    state = Api()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces", state.handle)
    loop = asyncio.new_event_loop()
    server = TestServer(app, host="127.0.0.1", loop=loop)  # type: ignore[call-arg]
    loop.run_until_complete(server.start_server(loop=loop))
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.port}"
    yield state, KubeHttp(client.ApiClient(cfg))
    state.watches.clear()
    state.closing = True
    # Close the server (and its hanging watch handlers) before the loop goes away.
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)


def _wait(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def _reflector(http: KubeHttp, metrics: Metrics, events: list[tuple[str, str]]) -> Reflector:
    def on_event(_res: Resource, typ: str, obj: Any, prev: Any) -> None:
        o = obj or prev
        events.append((typ, (o or {}).get("metadata", {}).get("name", "")))

    r = Reflector(http, Resource("namespaces", "Namespace", "v1"), on_event, metrics)
    r.backoff_initial = 0.05
    return r


def test_watch_events_bookmarks_and_410_relist(api: tuple[Api, KubeHttp]) -> None:
    state, http = api
    state.watches = [
        [
            {"type": "ADDED", "object": ns("c", 12)},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}},
            {"type": "DELETED", "object": ns("a", 21)},
            {
                "type": "ERROR",
                "object": {"kind": "Status", "code": 410, "message": "too old resource version"},
            },
        ],
        ["http410"],
    ]
    metrics = Metrics()
    events: list[tuple[str, str]] = []
    r = _reflector(http, metrics, events)
    r.start()
    try:
        _wait(lambda: state.lists >= 3)
        _wait(lambda: r.synced and len(state.watch_rvs) >= 3)
        # First watch resumed from the list's resourceVersion; after each 410 a relist, then a watch from it.
        assert state.watch_rvs[:3] == ["11", "11", "11"]
        assert ("ADDED", "c") in events and ("DELETED", "a") in events
        # The relist reconciles: "c" (seen only on the watch) is reported gone, "a" back.
        assert {k[1] for k in r.store} == {"a", "b"}
        assert ("DELETED", "c") in events
        assert 'draguard_cache_relists_total{resource="namespaces"} 3.0' in metrics.render().decode()
    finally:
        r.stop()


def test_dropped_stream_resumes_from_last_resource_version(api: tuple[Api, KubeHttp]) -> None:
    state, http = api
    state.watches = [
        [
            {
                "type": "MODIFIED",
                "object": {"metadata": {"name": "b", "resourceVersion": "15", "labels": {"x": "y"}}},
            }
        ]
    ]
    events: list[tuple[str, str]] = []
    r = _reflector(http, Metrics(), events)
    r.start()
    try:
        _wait(lambda: len(state.watch_rvs) >= 2)
        assert state.watch_rvs[:2] == ["11", "15"]  # no relist: the watch resumed where it stopped
        assert state.lists == 1
        assert r.store[("", "b")]["metadata"]["labels"] == {"x": "y"}
        assert r.store[("", "b")]["kind"] == "Namespace"  # list items get apiVersion/kind filled in
    finally:
        r.stop()


def _split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@given(
    docs=st.lists(st.dictionaries(st.text(max_size=8), st.integers(), max_size=3), max_size=12),
    blanks=st.lists(st.integers(min_value=0, max_value=2), max_size=12),
    cuts=st.lists(st.integers(min_value=0), max_size=20),
    final_newline=st.booleans(),
)
def test_watch_lines_gives_every_event_however_the_stream_is_cut(
    docs: list[dict[str, int]], blanks: list[int], cuts: list[int], final_newline: bool
) -> None:
    # Events as the API server writes them, with the blank lines a proxy may add, cut anywhere.
    pieces = []
    for i, d in enumerate(docs):
        pieces.append(json.dumps(d).encode() + b"\n" + b"\n" * (blanks[i] if i < len(blanks) else 0))
    stream = b"".join(pieces)
    if stream and not final_newline:
        stream = stream.rstrip(b"\n")
    got = [json.loads(line) for line in watch_lines(_split_at(stream, cuts))]
    assert got == docs


def test_watch_lines_reads_a_burst_in_one_chunk_and_an_object_in_many() -> None:
    burst = b"".join(json.dumps({"i": i}).encode() + b"\n" for i in range(5000))
    assert [json.loads(x)["i"] for x in watch_lines([burst])] == list(range(5000))
    big = json.dumps({"data": "x" * 100_000}).encode() + b"\n"
    chunks = [big[i : i + 1000] for i in range(0, len(big), 1000)]
    assert [len(x) for x in watch_lines(chunks)] == [len(big) - 1]
