"""The progress app end to end over HTTP (aiohttp test server), with the fake API of test_progress_auth.

Every refusal is a 4xx (or 503) with a short JSON reason and writes nothing; nothing a caller sends
turns into a 500 or a traceback; the answers never carry the token.
"""

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient as AnyTestClient
from aiohttp.test_utils import TestServer

from finetune_api.v1alpha1.status import Progress, TrainerReport
from finetune_operator import metrics
from finetune_operator.progress import server as server_module
from finetune_operator.progress.auth import Authenticator, audience
from finetune_operator.progress.ratelimit import RateLimiter
from finetune_operator.progress.server import MAX_BODY_BYTES, build_app, build_metrics_app
from tests.unit.test_progress_auth import GOOD, FakeApi, jwt

URL = "/v1/namespaces/ml/finetunejobs/demo/progress"
REPORT = TrainerReport(progress=Progress(step=5, total_steps=10, loss=1.5, percent=50.0)).to_dict(exclude_none=True)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
HUB_URL = f"https://huggingface.co/acme/demo-adapter/commit/{COMMIT}"


class Writer:
    """The status writer: records what it is asked to write; can say the job is gone, or fail."""

    def __init__(self, gone: bool = False, fails: Exception | None = None) -> None:
        self.written: list[tuple[str, str, dict[str, Any]]] = []
        self.gone, self.fails = gone, fails

    async def __call__(self, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        if self.fails is not None:
            raise self.fails
        self.written.append((ns, name, status))
        return None if self.gone else {"status": status}


TestClient = AnyTestClient[web.Request, web.Application]
Scenario = Callable[[TestClient], Awaitable[None]]


def run(scenario: Scenario, writer: Writer | None = None, auth: Authenticator | None = None) -> Writer:
    """Serve the app with the fakes, run the scenario, return the writer (what was written)."""
    writer = writer or Writer()

    async def main() -> None:
        app = build_app(auth or FakeApi().authenticator(), RateLimiter(rate=1.0, burst=1.0), writer)
        async with TestClient(TestServer(app)) as client:
            await scenario(client)

    asyncio.run(main())
    return writer


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def post(
    client: TestClient, body: Any, token: str | None = GOOD, raw: str | None = None
) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else json.dumps(body)
    resp = await client.post(URL, data=data, headers=bearer(token) if token else {})
    text = await resp.text()
    assert "Traceback" not in text and (token is None or token not in text)
    answer = json.loads(text)
    assert set(answer) == {"result", "reason", "message"} and len(answer["message"]) < 200
    return resp.status, answer


def answer_of(
    body: Any = None, token: str | None = GOOD, raw: str | None = None, **kwargs: Any
) -> tuple[int, str, Writer]:
    got: list[tuple[int, dict[str, Any]]] = []

    async def scenario(client: TestClient) -> None:
        got.append(await post(client, body, token, raw))

    writer = run(scenario, **kwargs)
    return got[0][0], got[0][1]["reason"], writer


@pytest.mark.parametrize(
    ("token", "body", "status", "reason"),
    [
        (None, REPORT, 401, "no_token"),
        ("not-a-token", REPORT, 401, "malformed_token"),
        (jwt(aud=audience("ml", "other"), pod="other-1-0"), REPORT, 401, "wrong_audience"),
        (jwt(pod="other-1-0"), REPORT, 403, "not_attempt_pod"),
        (jwt(pod="rogue"), REPORT, 403, "not_attempt_pod"),
        (GOOD, {"progress": {"step": -1}}, 400, "invalid_report"),
        (GOOD, {"progress": {"step": 1}, "surprise": 1}, 400, "invalid_report"),
        (GOOD, {"blob": "x" * (MAX_BODY_BYTES + 1)}, 413, "too_large"),
    ],
    ids=["no token", "not a JWT", "another job's token", "a pod of another job", "a pod with only the label",
         "a negative step", "an unknown field", "a body over 64 KiB"],
)
def test_refusals_write_nothing(token: str | None, body: Any, status: int, reason: str) -> None:
    got_status, got_reason, writer = answer_of(body, token)
    assert (got_status, got_reason) == (status, reason)
    assert writer.written == []


@pytest.mark.parametrize(
    "raw",
    [
        '{"progress": {"step": 1, "loss": NaN}}',
        '{"progress": {"step": 1, "loss": Infinity}}',
        '{"progress": {"step": 1, "loss": -Infinity}}',
        '{"progress": {"step": 1, "loss": "NaN"}}',
        '{"progress": {"step": 1, "loss": 1e999}}',
        '{"progress": {"step": 1, "loss": 1e308}}',
        '{"progress": {"step": 92233720368547758070}}',
        '{"progress": {"step": 11, "totalSteps": 10}}',
        '{"progress": ' * 2000 + "1" + "}" * 2000,
        '{"progress": {"step": 1}',
        "\u0000\u001b",
        "",
    ],
    ids=["nan", "inf", "-inf", "nan-string", "overflow", "loss-1e308", "int-over-int64", "beyond-total",
         "deep-nesting", "truncated", "control-bytes", "empty"],
)
def test_bad_numbers_and_bad_json_are_400_never_500(raw: str) -> None:
    status, reason, writer = answer_of(raw=raw)
    assert (status, reason) == (400, "invalid_report")
    assert writer.written == []


@pytest.mark.parametrize(
    ("output", "status", "reason"),
    [
        ({"url": "javascript:alert(1)"}, 400, "invalid_report"),
        ({"url": "https://evil.example.com/acme/demo-adapter"}, 422, "url_not_on_hub"),
        ({"url": "http://huggingface.co/acme/demo-adapter"}, 422, "url_not_on_hub"),
        ({"url": "https://huggingface.co/x\u0000\u001b[2J\r\n\u0007"}, 400, "invalid_report"),
        ({"url": "https://huggingface.co/" + "a" * 60_000}, 400, "invalid_report"),
        ({"hubRepo": "acme/someone-elses"}, 422, "repo_mismatch"),
        ({"hubRepo": "acme/demo-adapter\u001b[31m"}, 400, "invalid_report"),
        ({"revision": "x\u0000"}, 400, "invalid_report"),
    ],
    ids=["javascript", "another-host", "plain-http", "control-chars", "60kb", "another-repo", "repo-escape",
         "revision-nul"],
)
def test_output_is_only_this_jobs_hub_repo(output: dict[str, Any], status: int, reason: str) -> None:
    got_status, got_reason, writer = answer_of({"output": output})
    assert (got_status, got_reason) == (status, reason)
    assert writer.written == []


def test_a_real_push_is_written() -> None:
    output = {"hubRepo": "acme/demo-adapter", "revision": COMMIT, "url": HUB_URL}
    status, reason, writer = answer_of({"output": output})
    assert (status, reason) == (200, "ok")
    assert writer.written == [("ml", "demo", {"output": output})]


def test_a_job_without_a_hub_output_reports_none() -> None:
    api = FakeApi()
    api.facts[("ml", "demo")] = api.facts[("ml", "other")].__class__("ftj-demo", 2)  # no spec.output.hub
    status, reason, _ = answer_of({"output": {"url": HUB_URL}}, auth=api.authenticator())
    assert (status, reason) == (422, "output_without_hub")


def test_a_good_report_writes_progress_and_the_second_within_a_second_is_429() -> None:
    async def scenario(client: TestClient) -> None:
        first, second = await post(client, REPORT), await post(client, REPORT)
        assert (first[0], second[0], second[1]["reason"]) == (200, 429, "job_rate")

    ((ns, name, status),) = run(scenario).written
    assert (ns, name) == ("ml", "demo")
    assert status["progress"]["step"] == 5 and status["progress"]["percent"] == 50.0
    assert "updatedAt" in status["progress"] and "output" not in status


def test_a_status_write_failure_is_503_and_counted() -> None:
    before = metrics.PROGRESS_REJECTED.labels("status_write_failed")._value.get()
    status, reason, _ = answer_of(REPORT, writer=Writer(fails=RuntimeError("HTTP 422 from the API server")))
    assert (status, reason) == (503, "status_write_failed")
    assert metrics.PROGRESS_REJECTED.labels("status_write_failed")._value.get() == before + 1


def test_a_job_deleted_meanwhile_is_404() -> None:
    status, reason, _ = answer_of(REPORT, writer=Writer(gone=True))
    assert (status, reason) == (404, "job_gone")


def test_a_bug_is_a_short_json_500_without_a_traceback() -> None:
    class Broken(Authenticator):
        async def check(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug with a secret in its message")

    api = FakeApi()
    broken = Broken(api.review, api.pod, api.job, api.lookup)

    async def scenario(client: TestClient) -> None:
        resp = await client.post(URL, json=REPORT, headers=bearer(GOOD))
        text = await resp.text()
        assert resp.status == 500 and json.loads(text)["reason"] == "internal"
        assert "secret" not in text and "Traceback" not in text

    run(scenario, auth=broken)


def test_a_body_that_does_not_arrive_in_time_is_408(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "BODY_TIMEOUT_SECONDS", 0.3)

    async def scenario(client: TestClient) -> None:
        assert client.server.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
        writer.write(
            f"POST {URL} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {GOOD}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"progress\":".encode()
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.read(4096), 10)
        assert head.startswith(b"HTTP/1.1 408") and b"body_timeout" in head
        assert await asyncio.wait_for(reader.read(), 5) == b""  # and the connection is closed at once
        writer.close()

    assert run(scenario).written == []


def test_metrics_count_pushes_by_result_and_refusals_by_reason() -> None:
    async def main() -> str:
        async with TestClient(TestServer(build_metrics_app())) as client:
            return await (await client.get("/metrics")).text()

    answer_of(REPORT, token=None)
    answer_of(raw='{"progress": {"step": 1, "loss": NaN}}')
    text = asyncio.run(main())
    assert 'finetune_progress_pushes_total{result="unauthorized"}' in text
    assert 'finetune_progress_rejected_total{reason="no_token"}' in text
    assert 'finetune_progress_rejected_total{reason="invalid_report"}' in text
    assert 'finetune_progress_token_reviews_total{result="authenticated"}' in text
    assert GOOD not in text
