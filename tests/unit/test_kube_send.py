"""kube._send: answers are read and released but not decoded, and an HTTP error still raises the ApiException the
callers map (409 on create = exists, 404 on delete = gone, 400/422 = the spec, the rest = retry)."""

import asyncio
import json
from typing import Any

import kopf
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from finetune_operator.handlers.kube import Kube, RejectedError, _send


class FakeResponse:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.reason, self.released, self.headers = status, "reason", False, {}
        self.data = json.dumps(body).encode()

    async def read(self) -> bytes:
        return self.data

    def release(self) -> None:
        self.released = True


def _call(response: FakeResponse, seen: dict[str, Any]) -> Any:
    async def call(*args: Any, **kwargs: Any) -> FakeResponse:
        seen.update(kwargs)
        return response

    return call


def test_a_success_is_read_released_and_not_decoded() -> None:
    response, seen = FakeResponse(201, {"kind": "Job"}), {}
    assert asyncio.run(_send(_call(response, seen), "ns", {}, field_manager="m")) is None
    assert response.released and seen == {"field_manager": "m", "_preload_content": False}


def test_an_error_raises_with_status_and_readable_body() -> None:
    response = FakeResponse(422, {"message": "spec.template.spec.tolerations[0].effect: Unsupported value"})
    with pytest.raises(ApiException) as raised:
        asyncio.run(_send(_call(response, {})))
    assert response.released and raised.value.status == 422
    assert "Unsupported value" in json.loads(raised.value.body)["message"]


class FakeBatch:
    def __init__(self, status: int) -> None:
        self.status = status

    async def create_namespaced_job(self, *args: Any, **kwargs: Any) -> FakeResponse:
        return FakeResponse(self.status, {"message": "tolerations: Unsupported value"})


def _create(status: int) -> bool:
    class OneAnswerKube(Kube):
        @property
        def batch(self) -> Any:
            return FakeBatch(status)

    kube = OneAnswerKube(api=None)  # type: ignore[arg-type]
    return asyncio.run(kube.create_job({"metadata": {"name": "demo-1", "namespace": "ns"}}))


def test_create_job_maps_the_answers() -> None:
    assert _create(201) is True
    assert _create(409) is False  # already there: idempotent
    with pytest.raises(RejectedError, match="tolerations: Unsupported value"):
        _create(422)
    with pytest.raises(kopf.TemporaryError):
        _create(503)
