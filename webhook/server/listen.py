"""The listening side of `draguard serve`: a connection limit and bounded waits for each phase.

aiohttp's own server has no connection limit and waits for request headers as long as its
keep-alive timeout. Here, on top of it:

- a TLS handshake must finish within `handshake_timeout`, and a TLS shutdown within 2 s;
- a connection that has not sent a complete request line and headers within `idle_timeout`
  (from its start or from its last answer) is closed (aiohttp's keep-alive timer, which also
  runs before the first request);
- at most `max_connections` connections are open: at the limit, the longest-open connection that is
  not being answered is closed to make room (so idle or slow clients cannot lock the API server
  out); only when every connection is busy is the new one closed;
- reading a body is bounded by the caller (see `app.Webhook._handle`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web

log = logging.getLogger("draguard.server")


class _Refused(asyncio.Protocol):
    """Closes the connection as soon as it is made (the limit is reached and nothing is idle)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


def _busy(handler: Any) -> bool:
    return getattr(handler, "_current_request", None) is not None


class GuardedSite(web.TCPSite):
    """`web.TCPSite` with a connection limit and a TLS handshake timeout."""

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
        super().__init__(runner, host, port, ssl_context=ssl_context, backlog=backlog)
        self.max_connections = max_connections
        self.handshake_timeout = handshake_timeout
        self.on_drop = on_drop

    def open_connections(self) -> int:
        server = self._runner.server
        return len(server.connections) if server is not None else 0

    def _factory(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None
        conns = server.connections  # oldest first
        if len(conns) >= self.max_connections:
            idle = next((h for h in conns if not _busy(h)), None)
            if idle is None:
                self._dropped("limit")
                return _Refused()
            transport = idle.transport
            idle.force_close()
            if transport is not None:
                # No TLS close_notify exchange: a client that does not read would keep the
                # connection's buffers for the whole shutdown timeout.
                transport.abort()
            self._dropped("evicted")
        return server()

    def _dropped(self, why: str) -> None:
        if self.on_drop is not None:
            self.on_drop(why)

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        kwargs: dict[str, Any] = {}
        if self._ssl_context is not None:
            kwargs["ssl_handshake_timeout"] = self.handshake_timeout
            # Closing a TLS connection waits for the peer's close_notify; not for long.
            kwargs["ssl_shutdown_timeout"] = 2.0
        self._server = await loop.create_server(
            self._factory,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            **kwargs,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


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
