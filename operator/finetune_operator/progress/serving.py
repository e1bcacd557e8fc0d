"""Serving the progress (and metrics) app with limits on what a connection may hold, and for how long.

aiohttp alone waits 60 s for a TLS handshake and about an hour for request headers, and takes any
number of connections: 400 half-sent requests held 226 MB for as long as the client liked. Here:

* the TLS handshake must finish within `HANDSHAKE_TIMEOUT_SECONDS` (asyncio's own timer);
* the request headers must be complete within `HEADER_TIMEOUT_SECONDS` of the connection being up,
  and an idle keep-alive connection is closed after as long (aiohttp's keep-alive timer, which it
  starts when the connection opens and which arriving bytes do not push back);
* the body must arrive within `BODY_TIMEOUT_SECONDS` (the handler's read, in `server`);
* at most `MAX_CONNECTIONS` connections are open at once, `MAX_CONNECTIONS_PER_SOURCE` from one client
  address, counted from the TCP accept (a connection in its TLS handshake already holds asyncio's 256 KiB
  TLS read buffer); past that a new connection is closed at once (`ConnectionGate`), before any TLS.

A trainer opens one short connection per report (1,000 jobs reporting every 5 s keep a handful open at
once), so none of these limits touch it. The worst a client can hold is then about MAX_CONNECTIONS times
0.4 MB for HEADER_TIMEOUT_SECONDS plus HANDSHAKE_TIMEOUT_SECONDS.
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
MAX_CONNECTIONS = 64
MAX_CONNECTIONS_PER_SOURCE = 8
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
    """One accepted TCP connection: counted against the gate *before* TLS (a handshake holds memory too:
    asyncio gives each TLS connection a 256 KiB read buffer), upgraded to TLS here with a handshake
    timeout, then handed to aiohttp's protocol. Turned away at once when the gate is full."""

    def __init__(self, gate: ConnectionGate, server: web.Server, tls: ssl.SSLContext | None) -> None:
        self._gate = gate
        self._server = server
        self._tls = tls
        self._inner: Any = None
        self._source: str | None = None
        self._admitted = False
        self._early: list[bytes] = []  # data that arrived between the TLS handshake and the hand-over
        self._early_eof = False
        self._handshake: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else None
        if not self._gate.admit(source):
            transport.abort()  # type: ignore[attr-defined]
            return
        self._admitted, self._source = True, source
        if self._tls is None:
            self._hand_over(transport)
        else:
            self._handshake = asyncio.get_running_loop().create_task(self._upgrade(transport, self._tls))

    async def _upgrade(self, transport: asyncio.BaseTransport, tls: ssl.SSLContext) -> None:
        try:
            secure = await asyncio.get_running_loop().start_tls(
                transport,  # type: ignore[arg-type]
                self,
                tls,
                server_side=True,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_SECONDS,
            )
        except Exception:  # no handshake in time, not TLS, or the client went away: nothing to keep
            transport.abort()  # type: ignore[attr-defined]
            self._release()
            return
        if secure is None or secure.is_closing():
            self._release()
            return
        self._hand_over(secure)

    def _hand_over(self, transport: asyncio.BaseTransport) -> None:
        self._inner = self._server()
        self._inner.connection_made(transport)
        for data in self._early:
            self._inner.data_received(data)
        self._early.clear()
        if self._early_eof:
            self._inner.eof_received()

    def _release(self) -> None:
        if self._admitted:
            self._admitted = False
            self._gate.release(self._source)

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self._inner is not None:
            inner, self._inner = self._inner, None
            inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
        elif self._admitted:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return bool(self._inner.eof_received())
        self._early_eof = True
        return None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class GatedSite(web.BaseSite):
    """A TCP site whose connections pass a `ConnectionGate` (before TLS), with a TLS handshake timeout."""

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
        gate, tls = self.gate, self._ssl_context
        # A plain TCP server: TLS is started per connection by GatedProtocol, after the gate admitted it.
        self._server = await asyncio.get_running_loop().create_server(
            lambda: GatedProtocol(gate, server, tls),
            self.host,
            self.requested_port,
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
