"""Serving the progress (and metrics) app with limits on what a connection may hold, and for how long.

aiohttp alone waits 60 s for a TLS handshake and about an hour for request headers, and takes any
number of connections: 400 half-sent requests held 226 MB for as long as the client liked. Here:

* the TLS handshake must finish within `HANDSHAKE_TIMEOUT_SECONDS` (asyncio's own timer);
* the request headers must be complete within `HEADER_TIMEOUT_SECONDS` of the connection being up,
  and an idle keep-alive connection is closed after as long (aiohttp's keep-alive timer, which it
  starts when the connection opens and which arriving bytes do not push back);
* the body must arrive within `BODY_TIMEOUT_SECONDS` (the handler's read, in `server`);
* at most `MAX_CONNECTIONS` connections are open at once, `MAX_CONNECTIONS_PER_SOURCE` from one client
  address; past that a new connection is closed at once (`ConnectionGate`).

A trainer opens one short connection per report, so none of these limits touch it.
"""

import asyncio
import ssl
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from finetune_operator import metrics

HANDSHAKE_TIMEOUT_SECONDS = 10.0
HEADER_TIMEOUT_SECONDS = 10.0
BODY_TIMEOUT_SECONDS = 10.0
LINGERING_SECONDS = 2.0
"""How long an unread body is drained after an early answer (401, 429) before the connection closes."""
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_SOURCE = 32
MAX_HEADERS = 32


@dataclass
class ConnectionGate:
    """Counts open connections (total and per client address) and turns away those over the limits."""

    limit: int = MAX_CONNECTIONS
    per_source: int = MAX_CONNECTIONS_PER_SOURCE
    observed: bool = True
    """Report to the progress connection metrics (False for the /metrics port's own gate)."""
    open: int = 0
    by_source: Counter[str | None] = field(default_factory=Counter)

    def admit(self, source: str | None) -> bool:
        if self.open >= self.limit or self.by_source[source] >= self.per_source:
            if self.observed:
                metrics.PROGRESS_CONNECTIONS_REFUSED.inc()
            return False
        self.open += 1
        self.by_source[source] += 1
        if self.observed:
            metrics.PROGRESS_CONNECTIONS.set(self.open)
        return True

    def release(self, source: str | None) -> None:
        self.open -= 1
        self.by_source[source] -= 1
        if self.by_source[source] <= 0:
            del self.by_source[source]
        if self.observed:
            metrics.PROGRESS_CONNECTIONS.set(self.open)


class GatedProtocol(asyncio.Protocol):
    """Stands in front of aiohttp's protocol for one connection: admitted ones are handed over, others closed."""

    def __init__(self, gate: ConnectionGate, server: web.Server) -> None:
        self._gate = gate
        self._server = server
        self._inner: Any = None
        self._source: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else None
        if not self._gate.admit(source):
            transport.abort()  # type: ignore[attr-defined]
            return
        self._source = source
        self._inner = self._server()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            inner, self._inner = self._inner, None
            self._gate.release(self._source)
            inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class GatedSite(web.BaseSite):
    """A TCP site whose connections pass a `ConnectionGate`, with a TLS handshake timeout."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        gate: ConnectionGate | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self.host, self.requested_port = host, port
        self.gate = gate or ConnectionGate()
        self.port = port

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        gate = self.gate
        self._server = await asyncio.get_running_loop().create_server(
            lambda: GatedProtocol(gate, server),
            self.host,
            self.requested_port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_SECONDS if self._ssl_context else None,
            backlog=self._backlog,
            reuse_address=True,
        )
        if self._server.sockets:
            self.port = int(self._server.sockets[0].getsockname()[1])


async def serve(
    app: web.Application,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    *,
    host: str = "0.0.0.0",
    gate: ConnectionGate | None = None,
) -> tuple[web.AppRunner, GatedSite]:
    """Start `app` on host:port with the limits above; port 0 picks a free one (`site.port`)."""
    runner = web.AppRunner(
        app,
        access_log=None,
        handler_cancellation=True,
        keepalive_timeout=HEADER_TIMEOUT_SECONDS,
        lingering_time=LINGERING_SECONDS,
        max_headers=MAX_HEADERS,
    )
    await runner.setup()
    site = GatedSite(runner, host, port, ssl_context=ssl_context, gate=gate)
    await site.start()
    return runner, site
