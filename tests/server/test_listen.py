"""The listener on loopback over TLS: connections counted from the accept, the handshake deadline,
stalled bodies against the big-body slots, and answers during a connection storm."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from tests.server.conftest import free_port, make_webhook, review, write_policies
from tests.server.objects import legacy_pod_spec, workload
from webhook.server.app import BIG_BODIES, BIG_BODY, ServeOptions, Webhook, serve

UID = review(None)["request"]["uid"]
Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@contextlib.asynccontextmanager
async def running(tmp: Path, tls: Path, **opts: Any) -> AsyncIterator[tuple[int, Webhook]]:
    policies = write_policies(tmp / "pol", "enforce")
    port = free_port()
    options = ServeOptions(
        policies=str(policies),
        host="127.0.0.1",
        port=port,
        tls_cert=str(tls / "tls.crt"),
        tls_key=str(tls / "tls.key"),
        no_watch=True,
        poll_interval=0.1,
        shutdown_delay=0.0,
        **opts,
    )
    wh = make_webhook(policies)
    wh.opts = options
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(options, stop=stop, started=started, webhook=wh))
    await asyncio.wait_for(started.wait(), 10)
    try:
        yield port, wh
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait for a condition the server reaches on its own; fail saying which one it did not."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        await asyncio.sleep(0.01)


def dropped(wh: Webhook, reason: str) -> float:
    """draguard_connections_dropped_total{reason} as /metrics shows it (0 before the first)."""
    line = f'draguard_connections_dropped_total{{reason="{reason}"}} '
    for text in wh.metrics.render().decode().splitlines():
        if text.startswith(line):
            return float(text[len(line) :])
    return 0.0


def client_hello() -> bytes:
    """The first flight of a TLS client, to send and then never continue."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="draguard-webhook")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = outgoing.read()
    assert hello[:1] == b"\x16"  # a handshake record
    return hello


async def closed_by_server(conn: Conn, timeout: float = 10.0) -> bool:
    """Whether the server closes the connection (what it sent before, a TLS server hello, is skipped)."""
    reader, _ = conn
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(65536):
                pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


async def tls_open(port: int, ca: Path) -> Conn:
    ctx = ssl.create_default_context(cafile=str(ca))
    return await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")


def close_all(conns: list[Conn]) -> None:
    for _, writer in conns:
        writer.transport.abort()


def small_review() -> bytes:
    return json.dumps(review(workload("Pod", legacy_pod_spec()))).encode()


def big_review() -> bytes:
    obj = workload("Pod", legacy_pod_spec())
    obj["metadata"].setdefault("annotations", {})["example.com/padding"] = "x" * (BIG_BODY + 4096)
    body = json.dumps(review(obj)).encode()
    assert len(body) > BIG_BODY
    return body


async def post(port: int, ca: Path, body: bytes) -> tuple[int, dict[str, Any]]:
    ctx = ssl.create_default_context(cafile=str(ca))
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"https://127.0.0.1:{port}/validate",
            data=body,
            headers={"Content-Type": "application/json"},
            ssl=ctx,
        ) as r,
    ):
        return r.status, await r.json()


async def test_connections_that_never_start_tls_count_against_the_limit(
    tmp_path: Path, cert_dir: Path
) -> None:
    async with running(tmp_path, cert_dir, max_connections=8, handshake_timeout=60.0) as (port, wh):
        site = wh.site
        silent: list[Conn] = []
        for _ in range(8):
            silent.append(await asyncio.open_connection("127.0.0.1", port))
        await until(lambda: site.open_connections() == 8, "8 silent connections counted")
        # 24 more at once, each sending a ClientHello: each takes the place of the longest-waiting
        # one, never past the limit, including those accepted in the same burst.
        hello = client_hello()

        async def half_open() -> Conn:
            conn = await asyncio.open_connection("127.0.0.1", port)
            conn[1].write(hello)
            return conn

        silent += await asyncio.gather(*(half_open() for _ in range(24)))
        await until(lambda: dropped(wh, "evicted") == 24, "24 connections closed to make room")
        assert site.open_connections() == 8
        # Closed well before the 60 s handshake deadline: 24 of the 32, whichever they were.
        closed = await asyncio.gather(*(closed_by_server(c, timeout=5.0) for c in silent))
        assert sum(closed) == 24
        # A real client still gets its answer, in place of one of the waiting connections.
        status, doc = await post(port, cert_dir / "ca.crt", small_review())
        assert status == 200 and doc["response"]["uid"] == UID
        assert dropped(wh, "evicted") == 25 and dropped(wh, "limit") == 0
        close_all(silent)


async def test_a_silent_connection_is_closed_at_the_handshake_deadline(
    tmp_path: Path, cert_dir: Path
) -> None:
    async with running(tmp_path, cert_dir, handshake_timeout=0.5) as (port, wh):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        silent = await asyncio.open_connection("127.0.0.1", port)
        half = await asyncio.open_connection("127.0.0.1", port)
        half[1].write(client_hello())
        await until(lambda: wh.site.open_connections() == 2, "both connections counted while waiting")
        assert await closed_by_server(silent) and await closed_by_server(half)
        assert 0.4 < loop.time() - t0 < 5.0
        await until(lambda: wh.site.open_connections() == 0, "nothing left counted")
        assert dropped(wh, "handshake-timeout") == 2
        # The deadline is for the handshake only: a finished one is not cut off.
        conn = await tls_open(port, cert_dir / "ca.crt")
        await until(lambda: loop.time() - t0 > 1.2, "well past the handshake deadline")
        conn[1].write(b"GET /healthz HTTP/1.1\r\nHost: d\r\n\r\n")
        assert (await asyncio.wait_for(conn[0].readline(), 10)).startswith(b"HTTP/1.1 200")
        close_all([conn])


async def test_stalled_chunked_bodies_do_not_hold_big_reviews_past_the_body_timeout(
    tmp_path: Path, cert_dir: Path
) -> None:
    timeout = 1.0
    async with running(tmp_path, cert_dir, body_timeout=timeout) as (port, wh):
        stalled: list[Conn] = []
        for _ in range(10 * BIG_BODIES):
            conn = await tls_open(port, cert_dir / "ca.crt")
            conn[1].write(
                b"POST /validate HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
                b'Transfer-Encoding: chunked\r\n\r\nf\r\n{"apiVersion": \r\n'
            )
            stalled.append(conn)
        await until(lambda: wh.inflight == len(stalled), "every stalled request in the handler")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        status, doc = await asyncio.wait_for(post(port, cert_dir / "ca.crt", big_review()), 2.5 * timeout)
        assert status == 200 and doc["response"]["uid"] == UID
        assert loop.time() - t0 < 2.0 * timeout
        for conn in stalled:
            status_line = await asyncio.wait_for(conn[0].readline(), 10)
            assert status_line.startswith(b"HTTP/1.1 408"), status_line
        assert 'reason="body-timeout"} 20.0' in wh.metrics.render().decode()
        close_all(stalled)


async def test_reviews_are_answered_while_every_connection_holds_an_unfinished_body(
    tmp_path: Path, cert_dir: Path
) -> None:
    body = small_review()
    head = (
        b"POST /validate HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    async with running(tmp_path, cert_dir, max_connections=16, body_timeout=60.0) as (port, wh):
        storm: list[Conn] = []
        for _ in range(16):
            conn = await tls_open(port, cert_dir / "ca.crt")
            conn[1].write(head + body[:20])
            storm.append(conn)
        await until(lambda: wh.inflight == 16, "16 requests waiting for their bodies")
        answered: list[Awaitable[tuple[int, dict[str, Any]]]] = [
            post(port, cert_dir / "ca.crt", body) for _ in range(4)
        ]
        for status, doc in await asyncio.wait_for(asyncio.gather(*answered), 10):
            assert status == 200 and doc["response"]["uid"] == UID
        assert dropped(wh, "evicted") >= 4 and dropped(wh, "limit") == 0
        close_all(storm)
