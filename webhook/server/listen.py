"""The listening side of `draguard serve`: a connection limit and bounded waits for each phase.

aiohttp's own server has no connection limit and waits for request headers as long as its
keep-alive timeout; asyncio's TLS server only sees a connection once its handshake is done. Here:

- every connection counts against `max_connections` from the moment it is accepted, before and
  during its TLS handshake;
- the TLS handshake must finish within `handshake_timeout` of the accept, whether the client sends
  nothing at all or stops half-way; a TLS shutdown gets 2 s;
- a connection that has not sent a complete request line and headers within `idle_timeout`
  (from its handshake or from its last answer) is closed (aiohttp's keep-alive timer);
- at the limit, the longest-open connection that is not being answered (idle, or still sending
  its body) is closed to make room, else the longest-waiting one that has not finished its
  handshake; only when every connection is being answered is the new one closed, at once;
- reading a body is bounded by the caller (see `app.Webhook._handle`).

Why the TLS layer is built here rather than by `loop.create_server(ssl=...)`: asyncio makes its
TLS protocol for every accepted socket, and each one holds a 256 KiB receive buffer of its own from
the start, so a client holding open connections that never send a byte costs a replica about
300 KiB apiece. Here an accepted socket gets only a small gate object until its first bytes
arrive; the TLS state is made then, and every TLS connection of a thread reads into one shared
buffer (the loop copies each read into the connection's own, small, OpenSSL input before it reads
any other socket, so nothing is ever left in the shared buffer between reads). The HTTP handler is
made only once the handshake is done.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import threading
from asyncio import sslproto
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

log = logging.getLogger("draguard.server")

# Read size for TLS records (a record is at most 16 KiB plus overhead; a larger read only saves calls).
_READ_CHUNK = 64 * 1024
SHUTDOWN_TIMEOUT = 2.0


class _ReadBuffer(threading.local):
    def __init__(self) -> None:
        self.data = bytearray(_READ_CHUNK)
        self.view = memoryview(self.data)


_buffer = _ReadBuffer()


class _Refused(asyncio.Protocol):
    """Closes the connection as soon as it is made (the limit is reached and nothing is idle)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


class _Tls(sslproto.SSLProtocol):
    """asyncio's TLS protocol, reading into the thread's shared buffer instead of one of its own."""

    max_size = _READ_CHUNK

    def __init__(self, gate: _Gate, context: ssl.SSLContext, timeout: float) -> None:
        super().__init__(
            gate.site.loop,
            gate,
            context,
            cast("asyncio.Future[Any]", None),  # nobody waits for the handshake: the gate hears of it
            server_side=True,
            # The gate's deadline (from the accept) is the one that counts; this one is never shorter.
            ssl_handshake_timeout=max(1, math.ceil(timeout)),
            ssl_shutdown_timeout=SHUTDOWN_TIMEOUT,
        )
        # The base class allocated a buffer of max_size; drop it for the shared one.
        self._ssl_buffer = _buffer.data
        self._ssl_buffer_view = _buffer.view
        self.gate: _Gate | None = gate

    def get_buffer(self, n: int) -> memoryview:
        # A thread's loop reads one socket at a time and buffer_updated copies the bytes out at once.
        self._ssl_buffer = _buffer.data
        self._ssl_buffer_view = _buffer.view
        return _buffer.view

    def connection_lost(self, exc: BaseException | None) -> None:
        gate, self.gate = self.gate, None
        super().connection_lost(exc)
        if gate is not None:
            gate.lost()


class _Gate(asyncio.Protocol):
    """One accepted connection until its handshake is done: counted, timed, and cheap while it waits."""

    __slots__ = ("closed", "open", "site", "timer", "tls", "transport")

    def __init__(self, site: GuardedSite) -> None:
        self.site = site
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tls: _Tls | None = None
        self.open = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.transport is not None:
            # The second call comes from the TLS layer: the handshake is done.
            self._hand_over(cast(asyncio.Transport, transport))
            return
        self.transport = cast(asyncio.Transport, transport)
        if self.closed:
            # Closed to make room between the accept and this call (asyncio makes the transport in
            # a later task than the protocol): nothing else will close it.
            self.transport.abort()
            return
        if self.site.ssl_context is None:
            self._hand_over(self.transport)
            return
        self.timer = self.site.loop.call_later(self.site.handshake_timeout, self._expired)

    def data_received(self, data: bytes) -> None:
        # The first bytes of a TLS connection (a ClientHello, or junk): only now is TLS state made.
        transport = self.transport
        context = self.site.ssl_context
        if transport is None or context is None or self.tls is not None or self.timer is None:
            return
        remaining = self.timer.when() - self.site.loop.time()
        tls = self.tls = _Tls(self, context, remaining)
        transport.set_protocol(tls)
        tls.connection_made(transport)
        view = memoryview(data)
        while view and tls.gate is not None and not transport.is_closing():
            buf = tls.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            tls.buffer_updated(n)
            view = view[n:]

    def eof_received(self) -> bool | None:
        return False  # a client that closes before its first byte: close our side too

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost()

    def _hand_over(self, transport: asyncio.Transport) -> None:
        """The connection becomes an aiohttp connection: no longer waiting, no deadline of ours."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.site.pending.pop(self, None)
        self.open = True
        handler = self.site.handler()
        if self.tls is not None:
            self.tls._set_app_protocol(handler)
        else:
            transport.set_protocol(handler)
        handler.connection_made(transport)

    def lost(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.site.pending.pop(self, None)
        self.tls = None

    def close(self, why: str) -> None:
        self.closed = True
        self.lost()
        self.site.dropped(why)
        if self.transport is not None:
            self.transport.abort()

    def _expired(self) -> None:
        self.timer = None
        if not self.open:
            self.close("handshake-timeout")


def _answering(handler: Any) -> bool:
    """Whether the connection's request is complete and being answered (a body still arriving is not)."""
    request = getattr(handler, "_current_request", None)
    if request is None:
        return False
    try:
        return bool(request.content.is_eof())
    except Exception:  # an aiohttp internal that changed shape: treat the connection as busy
        return True


class GuardedSite(web.TCPSite):
    """`web.TCPSite` with a connection limit counted from the accept and a TLS handshake deadline."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 1024,
        max_connections: int = 256,
        handshake_timeout: float = 10.0,
        on_drop: Callable[[str], None] | None = None,
    ) -> None:
        # The TLS layer is this class's (see the module's docstring): aiohttp's site serves plain TCP.
        super().__init__(runner, host, port, backlog=backlog)
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.handshake_timeout = handshake_timeout
        self.on_drop = on_drop
        # Accepted, handshake not done; oldest first. Removed on hand-over, close or loss.
        self.pending: dict[_Gate, None] = {}
        self._evicted: set[Any] = set()  # handlers closed to make room, not yet gone from aiohttp's list
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    def _open(self) -> dict[Any, Any]:
        server = self._runner.server
        assert server is not None
        # aiohttp's own registry (a dict, oldest first); `.connections` copies it on every call.
        return cast("dict[Any, Any]", server._connections)

    def open_connections(self) -> int:
        if self._runner.server is None:
            return len(self.pending)
        established = self._open()
        if self._evicted:
            # Walks the few evicted handlers, not every connection (this runs on every accept).
            self._evicted = {h for h in self._evicted if h in established}
        return len(self.pending) + len(established) - len(self._evicted)

    def handler(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None
        return server()

    def dropped(self, why: str) -> None:
        if self.on_drop is not None:
            self.on_drop(why)

    def _accept(self) -> asyncio.BaseProtocol:
        if self.open_connections() >= self.max_connections and not self._make_room():
            self.dropped("limit")
            return _Refused()
        gate = _Gate(self)
        self.pending[gate] = None
        return gate

    def _make_room(self) -> bool:
        # Established connections that are not being answered go first, then the longest-waiting
        # handshake. Not the other way round: new connections arriving together are all still in
        # their handshakes and would close one another instead of an idle or stalled connection.
        for handler in self._open():
            if handler in self._evicted or _answering(handler):
                continue
            self._evicted.add(handler)
            transport = handler.transport
            handler.force_close()
            if transport is not None:
                # No TLS close_notify exchange: a client that does not read would keep the
                # connection's buffers for the whole shutdown timeout.
                transport.abort()
            self.dropped("evicted")
            return True
        if self.pending:
            next(iter(self.pending)).close("evicted")
            return True
        return False

    async def start(self) -> None:
        await web.BaseSite.start(self)
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            self._accept,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        await super().stop()
        # Connections still in their handshake are not aiohttp's: close them here.
        for gate in list(self.pending):
            gate.closed = True
            gate.lost()
            if gate.transport is not None:
                gate.transport.abort()


_QUIET = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, TimeoutError, ssl.SSLError)


def quiet_disconnects(loop: asyncio.AbstractEventLoop) -> None:
    """A client that resets its connection or fails its handshake is its own business: one debug
    line, not a traceback per connection in the webhook's log (an attacker could fill it)."""
    previous = loop.get_exception_handler()

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, _QUIET):
            log.debug("client connection failed", extra={"reason": f"{type(exc).__name__}: {exc}"[:200]})
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)
