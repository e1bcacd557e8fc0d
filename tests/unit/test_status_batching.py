"""Status writes: news (phase, attempt, conditions) at once; a ready count that moves again within a second
waits for a wake-up, so a burst of pod events costs one write, not one per pod."""

import asyncio
from types import SimpleNamespace
from typing import Any

from finetune_api.v1alpha1.status import FineTuneJobStatus
from finetune_operator.handlers import reconciling
from finetune_operator.handlers.state import OperatorConfig, OperatorState


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(status)
        return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": str(len(self.patches))}}

    async def post_event(self, *_: Any) -> None:
        return None


def _status(phase: str, ready: int) -> FineTuneJobStatus:
    return FineTuneJobStatus.model_validate(
        {"phase": phase, "attempt": 1, "readyNodes": ready, "message": f"attempt 1: {ready}/2 node(s) ready"}
    )


async def _writes(steps: list[FineTuneJobStatus]) -> tuple[list[dict[str, Any]], list[float]]:
    kube = FakeKube()
    state = OperatorState(config=OperatorConfig(image="t"), kube=kube)  # type: ignore[arg-type]
    job = SimpleNamespace(namespace="ns", name="demo")
    old: dict[str, Any] = {}
    for status in steps:
        body = {"metadata": {"namespace": "ns", "name": "demo"}, "status": old}
        actions: Any = SimpleNamespace(status=status, transitions=[])
        await reconciling._write_status(state, body, job, actions)  # type: ignore[arg-type]
        old = {**old, **kube.patches[-1]} if kube.patches else old
    wakeups = []
    while not state.wakeups.inbox.empty():
        due, _ = state.wakeups.inbox.get_nowait()
        wakeups.append(due)
    return kube.patches, wakeups


def test_a_ready_count_moving_again_within_a_second_waits_and_a_phase_change_does_not() -> None:
    patches, wakeups = asyncio.run(_writes([_status("Pending", 0), _status("Pending", 1), _status("Running", 2)]))
    assert [p.get("phase") for p in patches] == ["Pending", "Running"]  # 1/2 ready folded into Running
    assert patches[1]["readyNodes"] == 2
    assert len(wakeups) == 1  # the deferred count would have been written by this wake-up


def test_the_first_status_is_written_at_once() -> None:
    patches, wakeups = asyncio.run(_writes([_status("Pending", 0)]))
    assert len(patches) == 1 and wakeups == []
