"""kube._send: answers are read and released but not decoded, and an HTTP error still raises the ApiException the
callers map (how `Kube.create` maps them: tests/unit/test_ownership_kube.py)."""

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from finetune_operator.handlers.kube import _send


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
