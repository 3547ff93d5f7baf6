"""`draguard serve` with time stamps at each phase of a request, for `bench/apiserver.py --probe`.

    python bench/serve_probe.py serve ...   (the same arguments as `draguard serve`)

Nothing in webhook/ knows of this: it wraps, before the server starts, the points where a request
passes on the event loop's thread, and appends one JSON line per event batch to the file named by
DRAGUARD_PROBE_OUT. The tree served is the one on PYTHONPATH (`bench/apiserver.py --baseline` runs
another tree's server under the same probe). The points:

    wake   the loop's `select` returned (with the time it waited)
    rd     a TLS record's bytes were read from the socket (`_Tls.buffer_updated`, bytes)
    app    decrypted bytes reached aiohttp's HTTP parser (bytes)
    h0/h1  `Webhook._handle` entered / returned (with whether the body was all there at entry)
    p0/p1  `admission.parse_review` entered (the body is read) / returned
    s0/s1  `overlay.scope_of`;  v0/v1  `Rebuilder.view_for` (the admitted-objects overlay)
    l0/l1  `Webhook._lookups` (objects the caches lack)
    r0/r1  `admission.review` entered / returned
    a0/a1  `Webhook._safe_account` (metrics and the log line) entered / returned
    w0/w1  the socket write of the encrypted answer entered / returned
    idle   the loop's `select` entered (the thread has nothing left to do)

Each stamp is (name, perf_counter_ns, thread CPU ns, extra). `bench/apiserver.py --probe` reads the
file and splits the events into requests: from the last TLS read before `h0` to the next `h0`.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import sys
import threading
import time
from asyncio import selector_events
from typing import Any

# Run as a script, this file's folder comes first on sys.path, and bench/webhook.py would shadow the
# `webhook` package: the tree on PYTHONPATH is the one to serve.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

OUT = os.environ.get("DRAGUARD_PROBE_OUT", "/tmp/draguard-probe.jsonl")
_events: list[tuple[str, int, int, Any]] = []
_now = time.perf_counter_ns
_cpu = time.thread_time_ns


def _flush() -> None:
    if _events:
        with open(OUT, "a") as f:
            f.write(json.dumps(_events) + "\n")
        _events.clear()


atexit.register(_flush)


def stamp(name: str, extra: Any = None) -> None:
    _events.append((name, _now(), _cpu(), extra))


def install() -> None:
    from aiohttp import web_protocol

    from webhook.server import admission, app, listen

    sel_cls = selectors.DefaultSelector
    orig_select = sel_cls.select

    loop_thread = threading.get_ident()

    def select(self: Any, timeout: float | None = None) -> Any:
        if threading.get_ident() != loop_thread:
            return orig_select(self, timeout)
        if len(_events) > 20000:
            _flush()  # between requests, before the stamp of the loop going idle
        t = _now()
        _events.append(("idle", t, _cpu(), None))
        out = orig_select(self, timeout)
        _events.append(("wake", _now(), _cpu(), (_now() - t) // 1000))
        return out

    sel_cls.select = select  # type: ignore[method-assign]

    orig_updated = listen._Tls.buffer_updated

    def buffer_updated(self: Any, n: int) -> None:
        _events.append(("rd", _now(), _cpu(), n))
        orig_updated(self, n)

    listen._Tls.buffer_updated = buffer_updated  # type: ignore[method-assign]

    orig_data = web_protocol.RequestHandler.data_received

    def data_received(self: Any, data: bytes) -> None:
        _events.append(("app", _now(), _cpu(), len(data)))
        orig_data(self, data)

    web_protocol.RequestHandler.data_received = data_received  # type: ignore[method-assign]

    orig_handle = app.Webhook._handle

    async def handle(self: Any, endpoint: str, req: Any) -> Any:
        _events.append(("h0", _now(), _cpu(), bool(req.content.is_eof())))
        try:
            return await orig_handle(self, endpoint, req)
        finally:
            _events.append(("h1", _now(), _cpu(), None))

    app.Webhook._handle = handle  # type: ignore[method-assign]

    orig_parse = admission.parse_review

    kept = [0]

    def parse_review(body: bytes) -> Any:
        _events.append(("p0", _now(), _cpu(), len(body)))
        if kept[0] < 8:  # a few bodies as the API server sends them, to replay in-process
            kept[0] += 1
            with open(OUT + ".bodies", "ab") as f:
                f.write(body + b"\n")
        try:
            return orig_parse(body)
        finally:
            _events.append(("p1", _now(), _cpu(), None))

    admission.parse_review = parse_review

    orig_scope = app.scope_of

    def scope_of(request: Any) -> Any:
        _events.append(("s0", _now(), _cpu(), None))
        try:
            return orig_scope(request)
        finally:
            _events.append(("s1", _now(), _cpu(), None))

    app.scope_of = scope_of

    from webhook.server import usage

    orig_view = usage.Rebuilder.view_for

    def view_for(self: Any, scope: str) -> Any:
        _events.append(("v0", _now(), _cpu(), None))
        try:
            return orig_view(self, scope)
        finally:
            _events.append(("v1", _now(), _cpu(), None))

    usage.Rebuilder.view_for = view_for  # type: ignore[method-assign]

    orig_lookups = app.Webhook._lookups

    async def lookups(self: Any, *a: Any) -> Any:
        _events.append(("l0", _now(), _cpu(), None))
        try:
            return await orig_lookups(self, *a)
        finally:
            _events.append(("l1", _now(), _cpu(), None))

    app.Webhook._lookups = lookups  # type: ignore[method-assign]

    orig_review = admission.review

    def review(*a: Any, **k: Any) -> Any:
        _events.append(("r0", _now(), _cpu(), None))
        try:
            return orig_review(*a, **k)
        finally:
            _events.append(("r1", _now(), _cpu(), None))

    admission.review = review

    orig_account = app.Webhook._safe_account

    def safe_account(self: Any, *a: Any, **k: Any) -> None:
        _events.append(("a0", _now(), _cpu(), None))
        orig_account(self, *a, **k)
        _events.append(("a1", _now(), _cpu(), None))

    app.Webhook._safe_account = safe_account  # type: ignore[method-assign]

    orig_write = selector_events._SelectorSocketTransport.write

    def write(self: Any, data: Any) -> None:
        _events.append(("w0", _now(), _cpu(), len(data)))
        orig_write(self, data)
        _events.append(("w1", _now(), _cpu(), None))

    selector_events._SelectorSocketTransport.write = write  # type: ignore[method-assign]


def main() -> int:
    install()
    from webhook.cli import main as cli_main

    try:
        return cli_main(sys.argv[1:])
    finally:
        _flush()


if __name__ == "__main__":
    sys.exit(main())
