"""Status writes: news (phase, attempt, conditions) at once; a ready count that moves waits a second for a
wake-up (and is written at most once a second), so a burst of pod events costs one write, not one per pod."""

import asyncio
import time
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


async def _writes(
    steps: list[FineTuneJobStatus], last_write_ago: float | None = None, start: FineTuneJobStatus | None = None
) -> tuple[list[dict[str, Any]], list[float]]:
    kube = FakeKube()
    state = OperatorState(config=OperatorConfig(image="t"), kube=kube)  # type: ignore[arg-type]
    if last_write_ago is not None:
        state.status_written[("ns", "demo")] = time.monotonic() - last_write_ago
    job = SimpleNamespace(namespace="ns", name="demo")
    old: dict[str, Any] = start.to_dict(exclude_none=True) if start is not None else {}
    for status in steps:
        body = {"metadata": {"namespace": "ns", "name": "demo"}, "status": old}
        actions: Any = SimpleNamespace(status=status, transitions=[])
        await reconciling._write_status(state, body, job, actions)  # type: ignore[arg-type]
        old = {**old, **kube.patches[-1]} if kube.patches else old
    wakeups = []
    while not state.wakeups.inbox.empty():
        due, _, _ = state.wakeups.inbox.get_nowait()
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


def test_a_ready_count_waits_a_second_even_long_after_the_last_write() -> None:
    # the status a minute ago said 0/2 ready; 1/2 now waits, and the phase change that follows carries it
    written = _status("Pending", 0)
    patches, wakeups = asyncio.run(_writes([_status("Pending", 1)], last_write_ago=60, start=written))
    assert patches == [] and len(wakeups) == 1
    patches, _ = asyncio.run(_writes([_status("Pending", 1), _status("Running", 2)], last_write_ago=60, start=written))
    assert [(p.get("phase"), p.get("readyNodes")) for p in patches] == [("Running", 2)]


def _with(status: FineTuneJobStatus, *conditions: tuple[str, str]) -> FineTuneJobStatus:
    at = "2026-12-01T00:00:00Z"
    listed = [{"type": t, "status": v, "reason": t, "lastTransitionTime": at} for t, v in conditions]
    return FineTuneJobStatus.model_validate({**status.to_dict(exclude_none=True), "conditions": listed})


def test_pods_healthy_appearing_waits_and_a_pod_problem_does_not() -> None:
    created = _with(_status("Pending", 0), ("Created", "True"))
    healthy = _with(_status("Pending", 0), ("Created", "True"), ("PodsHealthy", "True"))
    patches, wakeups = asyncio.run(_writes([healthy], last_write_ago=60, start=created))
    assert patches == [] and len(wakeups) == 1  # the first pod exists and all is well: a detail
    stuck = _with(_status("Pending", 0), ("Created", "True"), ("PodsHealthy", "False"))
    patches, wakeups = asyncio.run(_writes([stuck], last_write_ago=0, start=created))
    assert len(patches) == 1 and wakeups == []  # a problem is news, written at once
