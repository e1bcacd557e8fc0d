"""The reconciler's apply order: ConfigMap and Service first, the attempt Job only once both exist, so a
crash (or a failed apply) in between never leaves a Job whose pods lack their config (found by the
full-size SIGKILL storm: a job Succeeded on KWOK with its Job but no ConfigMap or Service)."""

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from finetune_operator.handlers.indexes import owned_job
from finetune_operator.handlers.kube import Created
from finetune_operator.handlers.reconciling import _apply
from finetune_operator.runtime import Burst, ChildTriggers


class FakeKube:
    def __init__(self, fail_apply: bool = False) -> None:
        self.calls: list[str] = []
        self.fail_apply = fail_apply

    async def create(self, obj: dict[str, Any]) -> Created:
        if obj["kind"] == "Job":
            self.calls.append(f"create {obj['metadata']['name']}")
        else:
            await asyncio.sleep(0.01)
            if self.fail_apply:
                raise ConnectionResetError("operator killed / connection dropped")
            self.calls.append(f"apply {obj['kind']}")
        answer = {**obj, "metadata": {**obj["metadata"], "uid": f"u-{obj['metadata']['name']}"}}  # the object as made
        return Created(obj["kind"], "ns", obj["metadata"]["name"], json.dumps(answer).encode())


DEMO: Any = SimpleNamespace(namespace="ns", name="demo")


def _state(kube: Any) -> Any:
    return SimpleNamespace(kube=kube, children=ChildTriggers(), burst=Burst())


def _actions() -> Any:
    return SimpleNamespace(
        apply=[
            {"kind": "ConfigMap", "metadata": {"name": "demo-config", "namespace": "ns"}},
            {"kind": "Service", "metadata": {"name": "demo", "namespace": "ns"}},
        ],
        create=[{"kind": "Job", "metadata": {"name": "demo-1"}}],
        delete_jobs=[],
        suspend_jobs={},
        job_uids={},
        status=SimpleNamespace(attempt=2),
    )


def test_the_job_is_created_after_its_configmap_and_service() -> None:
    kube = FakeKube()
    asyncio.run(_apply(_state(kube), DEMO, _actions(), []))
    assert kube.calls[-1] == "create demo-1"
    assert sorted(kube.calls[:2]) == ["apply ConfigMap", "apply Service"]


def test_no_job_is_created_when_an_apply_fails() -> None:
    kube = FakeKube(fail_apply=True)
    with pytest.raises(ConnectionResetError):
        asyncio.run(_apply(_state(kube), DEMO, _actions(), []))
    assert kube.calls == []


def test_the_first_event_of_the_job_a_round_created_is_no_news() -> None:
    kube = FakeKube()
    state = _state(kube)
    asyncio.run(_apply(state, DEMO, _actions(), []))
    made = {"kind": "Job", "metadata": {"name": "demo-1", "uid": "u-demo-1"}}  # as the create answered
    assert not state.children.changed("u-demo-1", owned_job(made))  # this round's status already counts it
    condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    failed = {**made, "status": {"conditions": [condition]}}
    assert state.children.changed("u-demo-1", owned_job(failed))  # a change after the create still is
    assert state.children.changed("u-demo-1-x", owned_job({**made, "metadata": {"name": "x", "uid": "u-demo-1-x"}}))
