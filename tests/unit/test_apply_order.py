"""The reconciler's apply order: ConfigMap and Service first, the attempt Job only once both exist, so a
crash (or a failed apply) in between never leaves a Job whose pods lack their config (found by the
full-size SIGKILL storm: a job Succeeded on KWOK with its Job but no ConfigMap or Service)."""

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from finetune_operator.handlers.kube import Created
from finetune_operator.handlers.reconciling import _apply


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
        return Created(obj["kind"], "ns", obj["metadata"]["name"], b"{}")


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
    asyncio.run(_apply(SimpleNamespace(kube=kube), SimpleNamespace(namespace="ns", name="demo"), _actions(), []))
    assert kube.calls[-1] == "create demo-1"
    assert sorted(kube.calls[:2]) == ["apply ConfigMap", "apply Service"]


def test_no_job_is_created_when_an_apply_fails() -> None:
    kube = FakeKube(fail_apply=True)
    with pytest.raises(ConnectionResetError):
        asyncio.run(_apply(SimpleNamespace(kube=kube), SimpleNamespace(namespace="ns", name="demo"), _actions(), []))
    assert kube.calls == []
