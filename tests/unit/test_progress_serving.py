"""What a connection may hold, and for how long: TLS handshake and header deadlines, connection caps.

Real sockets on 127.0.0.1 against `serving.serve` (the deadlines shortened for the test); every
assertion is about what the server did (closed, answered, counted), with generous upper bounds on
how long the test waits, never a measured duration.
"""

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from finetune_operator import metrics
from finetune_operator.progress import serving
from finetune_operator.progress.serving import ConnectionGate, serve
from finetune_operator.progress.tls import ensure_pair, server_context

WAIT = 10.0  # the most a test waits for the server to act on a deadline of a fraction of a second


def hello_app() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    return app


def run(scenario: Callable[[int], Awaitable[None]], *, tls: ssl.SSLContext | None = None,
        gate: ConnectionGate | None = None) -> None:
    async def main() -> None:
        runner, site = await serve(hello_app(), 0, tls, host="127.0.0.1", gate=gate)
        try:
            await scenario(site.port)
        finally:
            await runner.cleanup()

    asyncio.run(main())


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closes the connection (EOF or reset) within WAIT seconds."""
    try:
        while await asyncio.wait_for(reader.read(1024), WAIT):
            pass
    except (ConnectionError, ssl.SSLError):
        pass
    return True


async def get(port: int, context: ssl.SSLContext | None = None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), WAIT)
    writer.close()
    return data


@pytest.fixture
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "HEADER_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(serving, "HANDSHAKE_TIMEOUT_SECONDS", 0.5)


def client_tls() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def test_a_normal_request_passes_the_gate_over_http_and_https() -> None:
    cert, key, _ = ensure_pair(None, None, ["127.0.0.1"])

    async def plain(port: int) -> None:
        assert (await get(port)).endswith(b"hello")

    async def secure(port: int) -> None:
        assert (await get(port, client_tls())).endswith(b"hello")

    run(plain)
    run(secure, tls=server_context(cert, key))


def test_headers_that_trickle_in_are_cut_off_at_the_deadline(short_deadlines: None) -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\n")

        async def trickle() -> None:  # a byte every 0.1 s, never the blank line that ends the headers
            for _ in range(int(WAIT * 10)):
                writer.write(b"X")
                await writer.drain()
                await asyncio.sleep(0.1)

        trickling = asyncio.create_task(trickle())
        try:
            assert await closed_by_server(reader)
        finally:
            trickling.cancel()
            writer.close()

    run(scenario)


def test_a_connection_that_never_starts_tls_is_closed(short_deadlines: None) -> None:
    cert, key, _ = ensure_pair(None, None, ["127.0.0.1"])

    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_by_server(reader)
        writer.close()

    run(scenario, tls=server_context(cert, key))


def test_connections_past_the_cap_are_closed_at_once_and_counted() -> None:
    gate = ConnectionGate(limit=5, per_source=100)
    before = metrics.PROGRESS_CONNECTIONS_REFUSED._value.get()

    async def scenario(port: int) -> None:
        held: list[Any] = []
        for _ in range(5):
            held.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.2)
        assert gate.open == 5
        extra = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        for reader, writer in extra:
            assert await closed_by_server(reader)
            writer.close()
        assert metrics.PROGRESS_CONNECTIONS_REFUSED._value.get() == before + 3
        for _, writer in held:
            writer.close()
        for _ in range(int(WAIT * 10)):
            if gate.open == 0:
                break
            await asyncio.sleep(0.1)
        assert gate.open == 0 and not gate.by_source
        assert (await get(port)).endswith(b"hello")  # room again

    run(scenario, gate=gate)


def test_one_address_cannot_take_every_slot() -> None:
    gate = ConnectionGate(limit=100, per_source=3)

    async def scenario(port: int) -> None:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_by_server(reader)
        writer.close()
        assert gate.by_source["127.0.0.1"] == 3
        for _, w in held:
            w.close()

    run(scenario, gate=gate)


def test_connections_still_in_their_tls_handshake_count_against_the_cap() -> None:
    """A client that connects and never says hello already holds a slot (and asyncio's TLS buffers):
    the gate counts it from the TCP accept, so such connections cannot pile up past the cap."""
    cert, key, _ = ensure_pair(None, None, ["127.0.0.1"])
    gate = ConnectionGate(limit=4, per_source=100)

    async def scenario(port: int) -> None:
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        await asyncio.sleep(0.2)
        assert gate.open == 4
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_by_server(reader)  # the fifth is turned away before any TLS
        writer.close()
        for _, w in silent:
            w.close()
        for _ in range(int(WAIT * 10)):
            if gate.open == 0:
                break
            await asyncio.sleep(0.1)
        assert gate.open == 0
        assert (await get(port, client_tls())).endswith(b"hello")

    run(scenario, tls=server_context(cert, key), gate=gate)
