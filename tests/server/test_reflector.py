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

from webhook.server.caches import KubeHttp, Reflector, Resource, event_lines
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
        # Streaming the initial state (sendInitialEvents): off answers 422 as a server without
        # WatchList does; `end_bookmark` False leaves the initial events unended.
        self.watch_list = False
        self.end_bookmark = True
        self.refused = 0
        self.streamed = 0
        self.relist_state: tuple[list[dict[str, Any]], int] | None = None  # (items, rv) from the 2nd stream

    def initial_events(self) -> list[Any]:
        events: list[Any] = [{"type": "ADDED", "object": it} for it in self.items]
        if self.end_bookmark:
            end = {"resourceVersion": str(self.rv), "annotations": {"k8s.io/initial-events-end": "true"}}
            events.append({"type": "BOOKMARK", "object": {"metadata": end}})
        return events

    async def handle(self, req: web.Request) -> web.StreamResponse:
        initial = req.query.get("sendInitialEvents") == "true"
        if initial and not self.watch_list:
            self.refused += 1
            return web.json_response(
                {
                    "kind": "Status",
                    "code": 422,
                    "reason": "Invalid",
                    "message": "sendInitialEvents is forbidden",
                },
                status=422,
            )
        if initial:
            self.streamed += 1
            if self.streamed > 1 and self.relist_state is not None:
                self.items, self.rv = self.relist_state
            script = self.watches.pop(0) if self.watches else ["hang"]
            self.watches.insert(0, [*self.initial_events(), *script])
        if req.query.get("watch") != "true":
            self.lists += 1
            return web.json_response(
                {"kind": "NamespaceList", "metadata": {"resourceVersion": str(self.rv)}, "items": self.items}
            )
        if not initial:
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
        # This server does not stream initial state: asked once, then pages for every relist.
        assert state.refused == 1 and r.watch_list is False
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


def test_initial_state_streams_where_the_server_sends_it(api: tuple[Api, KubeHttp]) -> None:
    state, http = api
    state.watch_list = True
    state.watches = [[{"type": "MODIFIED", "object": {"metadata": {"name": "b", "resourceVersion": "12"}}}]]
    metrics = Metrics()
    events: list[tuple[str, str]] = []
    r = _reflector(http, metrics, events)
    r.start()
    try:
        _wait(lambda: r.synced and ("MODIFIED", "b") in events)
        # No list at all: the objects came as the watch's initial events, the store replaced at the
        # end bookmark, and the watch went on from there on the same stream.
        assert state.lists == 0 and state.streamed == 1
        assert events[:4] == [("ADDED", "a"), ("ADDED", "b"), ("SYNCED", ""), ("MODIFIED", "b")]
        assert r.resource_version == "12"
        assert r.store[("", "a")]["kind"] == "Namespace"
        assert 'draguard_cache_list_duration_seconds{resource="namespaces"}' in metrics.render().decode()
    finally:
        r.stop()


def test_a_streamed_relist_reports_what_went_missing(api: tuple[Api, KubeHttp]) -> None:
    state, http = api
    state.watch_list = True
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
    state.watches = [[gone]]
    state.relist_state = ([ns("b", 11), ns("c", 13)], 13)  # while the watch was gone: a deleted, c created
    events: list[tuple[str, str]] = []
    r = _reflector(http, Metrics(), events)
    r.start()
    try:
        _wait(lambda: ("DELETED", "a") in events and ("ADDED", "c") in events)
        assert {k[1] for k in r.store} == {"b", "c"}
        assert state.lists == 0 and state.streamed == 2
    finally:
        r.stop()


def test_initial_events_that_never_end_fall_back_to_pages(api: tuple[Api, KubeHttp]) -> None:
    state, http = api
    state.watch_list, state.end_bookmark = True, False
    state.watches = [[]]  # the stream ends right after the initial events, with no end bookmark
    events: list[tuple[str, str]] = []
    r = _reflector(http, Metrics(), events)
    r.start()
    try:
        _wait(lambda: r.synced)
        # The unended stream published nothing; the paged list that followed did, once.
        assert state.streamed == 1 and state.lists == 1 and r.watch_list is False
        assert events[:3] == [("ADDED", "a"), ("ADDED", "b"), ("SYNCED", "")]
    finally:
        r.stop()


def test_an_event_over_the_size_limit_is_not_held_and_the_cache_is_listed_again(
    api: tuple[Api, KubeHttp],
) -> None:
    state, http = api
    big = {"metadata": {"name": "big", "resourceVersion": "12", "labels": {"x": "y" * 4096}}}
    state.watches = [[{"type": "ADDED", "object": big}]]
    events: list[tuple[str, str]] = []
    r = _reflector(http, Metrics(), events)
    r.max_event_bytes = 1024
    r.start()
    try:
        _wait(lambda: state.lists >= 2 and r.synced)
        # What the oversized event was about is unknown: never stored, and a fresh list instead.
        assert ("", "big") not in r.store and ("ADDED", "big") not in events
        assert {k[1] for k in r.store} == {"a", "b"}
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
def test_event_lines_gives_every_event_however_the_stream_is_cut(
    docs: list[dict[str, int]], blanks: list[int], cuts: list[int], final_newline: bool
) -> None:
    # Events as the API server writes them, with the blank lines a proxy may add, cut anywhere.
    pieces = []
    for i, d in enumerate(docs):
        pieces.append(json.dumps(d).encode() + b"\n" + b"\n" * (blanks[i] if i < len(blanks) else 0))
    stream = b"".join(pieces)
    if stream and not final_newline:
        stream = stream.rstrip(b"\n")
    got = [json.loads(line) for line in event_lines(_split_at(stream, cuts))]
    assert got == docs


def test_event_lines_reads_a_burst_in_one_chunk_and_an_object_in_many() -> None:
    burst = b"".join(json.dumps({"i": i}).encode() + b"\n" for i in range(5000))
    assert [json.loads(x)["i"] for x in event_lines([burst])] == list(range(5000))
    big = json.dumps({"data": "x" * 100_000}).encode() + b"\n"
    chunks = [big[i : i + 1000] for i in range(0, len(big), 1000)]
    assert [len(x) for x in event_lines(chunks)] == [len(big) - 1]
