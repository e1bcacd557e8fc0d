"""The client's answers to a struggling API server: transient statuses retried, the rest as clear errors.

A real control plane cannot be made to answer 429 on cue, so a small HTTP server on 127.0.0.1 speaks the few
API paths involved, in the API server's own words (its Status bodies and watch-event lines), and the real
`kubernetes_asyncio` client talks to it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from finetune_operator.view import client as view
from finetune_operator.view.client import Cluster, ViewError, next_job_change, read_job

JOB_PATH = "/apis/finetune.dev/v1alpha1/namespaces/ml/finetunejobs"
JOB: dict[str, Any] = {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob",
       "metadata": {"name": "demo", "namespace": "ml", "resourceVersion": "7"}, "status": {"phase": "Running"}}


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}


Handler = Callable[[web.Request], Any]


async def serve(routes: dict[str, Handler]) -> tuple[web.AppRunner, str]:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def cluster_at(host: str) -> Cluster:
    configuration = client.Configuration(host=host)
    return Cluster(api=client.ApiClient(configuration), namespace="ml", source="kubeconfig test")


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(view, "RETRY_SECONDS", (0.01, 0.01, 0.01))


async def _with_server(routes: dict[str, Handler]) -> AsyncIterator[Cluster]:
    runner, host = await serve(routes)
    cluster = await cluster_at(host)
    try:
        yield cluster
    finally:
        await cluster.api.close()
        await runner.cleanup()


def run(routes: dict[str, Handler], body: Callable[[Cluster], Any]) -> Any:
    async def main() -> Any:
        async for cluster in _with_server(routes):
            return await body(cluster)

    return asyncio.run(main())


def test_a_get_is_retried_after_429_and_503() -> None:
    answers = [(429, status_body(429, "TooManyRequests", "storage is (re)initializing")),
               (503, status_body(503, "ServiceUnavailable", "etcd leader changed")), (200, JOB)]
    seen: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        code, body = answers[len(seen)]
        seen.append(code)
        return web.json_response(body, status=code)

    assert run({f"{JOB_PATH}/demo": handler}, lambda c: read_job(c, "demo")) == JOB
    assert seen == [429, 503, 200]


def test_a_get_that_keeps_failing_ends_with_the_servers_message() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(status_body(429, "TooManyRequests", "slow down"), status=429)

    with pytest.raises(ViewError, match=r"^FineTuneJob demo: HTTP 429: slow down$"):
        run({f"{JOB_PATH}/demo": handler}, lambda c: read_job(c, "demo"))


def test_not_found_and_forbidden_are_said_plainly() -> None:
    async def missing(request: web.Request) -> web.Response:
        return web.json_response(status_body(404, "NotFound", 'finetunejobs "demo" not found'), status=404)

    async def forbidden(request: web.Request) -> web.Response:
        message = 'finetunejobs.finetune.dev "demo" is forbidden: User "bob" cannot get resource'
        return web.json_response(status_body(403, "Forbidden", message), status=403)

    with pytest.raises(ViewError, match=r"^FineTuneJob demo not found in namespace ml$"):
        run({f"{JOB_PATH}/demo": missing}, lambda c: read_job(c, "demo"))
    with pytest.raises(ViewError, match=r'^FineTuneJob demo: HTTP 403: .* User "bob" cannot get resource$'):
        run({f"{JOB_PATH}/demo": forbidden}, lambda c: read_job(c, "demo"))


def test_a_watch_resumes_after_a_transient_error_event_from_the_last_version() -> None:
    """The API server ends a watch with an ERROR event carrying a 429 Status while a CRD's storage reinitialises;
    the watch is opened again from the same resourceVersion and the next change comes through."""
    versions: list[str | None] = []
    changed = {**JOB, "metadata": {**JOB["metadata"], "resourceVersion": "9"}, "status": {"phase": "Succeeded"}}

    async def handler(request: web.Request) -> web.StreamResponse:
        assert request.query["watch"].lower() == "true"
        assert request.query["fieldSelector"] == "metadata.name=demo"
        versions.append(request.query.get("resourceVersion"))
        response = web.StreamResponse()
        await response.prepare(request)
        if len(versions) == 1:
            event = {"type": "ERROR", "object": status_body(429, "TooManyRequests", "storage is (re)initializing")}
        else:
            event = {"type": "MODIFIED", "object": changed}
        await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
        return response

    got = run({JOB_PATH: handler}, lambda c: next_job_change(c, "demo", "7"))
    assert got == changed
    assert versions == ["7", "7"]


def test_a_watch_that_lost_its_version_asks_for_a_fresh_read() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        gone = {"type": "ERROR", "object": status_body(410, "Expired", "too old resource version: 7 (12)")}
        await response.write(json.dumps(gone).encode() + b"\n")
        await response.write_eof()
        return response

    assert run({JOB_PATH: handler}, lambda c: next_job_change(c, "demo", "7")) is None


def test_a_watch_answered_by_something_else_is_retried_then_a_clear_error() -> None:
    calls: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        calls.append(1)
        return web.Response(text="<html>502 Bad Gateway</html>", status=502, content_type="text/html")

    with pytest.raises(ViewError, match=r"^a watch got an answer that is not a watch event: <html>502 Bad Gateway"):
        run({JOB_PATH: handler}, lambda c: next_job_change(c, "demo", "7"))
    assert len(calls) == 1 + len(view.RETRY_SECONDS)
