"""The progress app end to end over HTTP (aiohttp test server), with fake auth and status writer."""

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from finetune_api.v1alpha1.status import Progress, TrainerReport
from finetune_operator.progress.auth import Authenticator
from finetune_operator.progress.ratelimit import RateLimiter
from finetune_operator.progress.server import MAX_BODY_BYTES, build_app, build_metrics_app
from tests.unit.test_progress_auth import FakeApi

URL = "/v1/namespaces/ml/finetunejobs/demo/progress"
REPORT = TrainerReport(progress=Progress(step=5, total_steps=10, loss=1.5, percent=50.0)).to_dict(exclude_none=True)


def run(scenario: Callable[[TestClient, list[Any]], Awaitable[None]]) -> list[Any]:
    """Serve the app with fakes, run the scenario, return what was written to status."""
    written: list[Any] = []

    async def write(ns: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        written.append((ns, name, status))
        return {"status": status} if name == "demo" else None

    async def main() -> None:
        api = FakeApi()
        app = build_app(Authenticator(api.review, api.pod), RateLimiter(rate=1.0, burst=1.0), write)
        async with TestClient(TestServer(app)) as client:
            await scenario(client, written)

    asyncio.run(main())
    return written


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({}, REPORT, 401),
        (bearer("other-job"), REPORT, 401),
        (bearer("other-pod-same-aud"), REPORT, 403),
        (bearer("good"), {"progress": {"step": -1}}, 400),
        (bearer("good"), {"progress": {"step": 1}, "surprise": 1}, 400),
        (bearer("good"), {"blob": "x" * (MAX_BODY_BYTES + 1)}, 413),
    ],
    ids=[
        "no token is 401",
        "another job's token is 401",
        "a pod outside the job is 403",
        "a negative step is 400",
        "an unknown field is 400",
        "a body over 64 KiB is 413",
    ],
)
def test_refusals_write_nothing(headers: dict[str, str], body: Any, status: int) -> None:
    async def scenario(client: TestClient, _: list[Any]) -> None:
        resp = await client.post(URL, data=json.dumps(body), headers=headers)
        assert resp.status == status
        assert "good" not in await resp.text()

    assert run(scenario) == []


def test_a_good_report_writes_progress_and_the_second_within_a_second_is_429() -> None:
    async def scenario(client: TestClient, _: list[Any]) -> None:
        first = await client.post(URL, json=REPORT, headers=bearer("good"))
        second = await client.post(URL, json=REPORT, headers=bearer("good"))
        assert (first.status, second.status) == (200, 429)

    ((ns, name, status),) = run(scenario)
    assert (ns, name) == ("ml", "demo")
    assert status["progress"]["step"] == 5 and status["progress"]["percent"] == 50.0
    assert "updatedAt" in status["progress"] and "output" not in status


def test_metrics_count_pushes_by_result() -> None:
    async def main() -> str:
        async with TestClient(TestServer(build_metrics_app())) as client:
            return await (await client.get("/metrics")).text()

    run(lambda client, _: client.post(URL, json=REPORT))
    assert 'finetune_progress_pushes_total{result="unauthorized"}' in asyncio.run(main())
