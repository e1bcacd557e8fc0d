"""Status writes: news (phase, attempt, conditions) at once; a ready count that moves waits a second for a
wake-up (and is written at most once a second), so a burst of pod events costs one write, not one per pod.
A new job's first "Pending, pods starting" waits up to two seconds, with its event: Running, when it comes
meanwhile, is then the job's first status write and its only event. During a burst of new jobs a new job's start
(and a ready count) waits for the burst's end; news does not."""

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from finetune_api.v1alpha1.status import FineTuneJobStatus
from finetune_operator.handlers import reconciling
from finetune_operator.handlers.reconciling import STARTING_STATUS_SECONDS
from finetune_operator.handlers.state import OperatorConfig, OperatorState
from finetune_operator.runtime.burst import BURST_JOBS
from finetune_operator.status import Transition


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []
        self.events: list[str] = []

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(status)
        return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": str(len(self.patches))}}

    async def post_event(self, _body: Any, _type: str, reason: str, _message: str) -> None:
        self.events.append(reason)


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


def test_a_first_status_without_conditions_is_written_at_once() -> None:
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


STARTING = Transition("Normal", "PodsStarting", "attempt 1: 0/2 node(s) ready")
READY = Transition("Normal", "AllNodesReady", "attempt 1: 2/2 node(s) running")


async def _rounds(
    steps: list[tuple[FineTuneJobStatus, Transition]], waited: float = 0.0
) -> tuple[FakeKube, OperatorState]:
    """Rounds of one new job, each against the status written so far; `waited`: how long ago the first round
    left its status to a wake-up (as if the job's earlier rounds had waited that long)."""
    kube = FakeKube()
    state = OperatorState(config=OperatorConfig(image="t"), kube=kube)  # type: ignore[arg-type]
    if waited:
        state.details_seen[("ns", "demo")] = time.monotonic() - waited
    job = SimpleNamespace(namespace="ns", name="demo")
    old: dict[str, Any] = {}
    for status, transition in steps:
        body = {"metadata": {"namespace": "ns", "name": "demo"}, "status": old}
        actions: Any = SimpleNamespace(status=status, transitions=[transition])
        await reconciling._write_status(state, body, job, actions)  # type: ignore[arg-type]
        old = {**old, **kube.patches[-1]} if kube.patches else old
    return kube, state


def test_a_new_jobs_first_pending_waits_with_its_event_and_running_replaces_both() -> None:
    pending = _with(_status("Pending", 0), ("Created", "True"))
    running = _with(_status("Running", 2), ("Created", "True"), ("Running", "True"))
    kube, state = asyncio.run(_rounds([(pending, STARTING)]))
    assert kube.patches == [] and kube.events == []  # nothing written or announced yet
    due, _, _ = state.wakeups.inbox.get_nowait()  # a wake-up writes it once the two seconds passed
    assert STARTING_STATUS_SECONDS - 0.5 < due - time.monotonic() <= STARTING_STATUS_SECONDS
    kube, _ = asyncio.run(_rounds([(pending, STARTING), (running, READY)]))
    assert [p["phase"] for p in kube.patches] == ["Running"] and kube.events == ["AllNodesReady"]


def test_a_new_jobs_first_pending_is_written_with_its_event_once_its_wait_passed() -> None:
    pending = _with(_status("Pending", 0), ("Created", "True"))
    kube, _ = asyncio.run(_rounds([(pending, STARTING)], waited=STARTING_STATUS_SECONDS))
    assert [p["phase"] for p in kube.patches] == ["Pending"] and kube.events == ["PodsStarting"]


def test_a_new_jobs_first_status_with_news_is_written_at_once() -> None:
    stuck = _with(_status("Pending", 0), ("Created", "True"), ("PodsHealthy", "False"))
    waiting = _with(_status("Pending", 0), ("Suspended", "True"))
    for status in (stuck, waiting):
        kube, _ = asyncio.run(_rounds([(status, STARTING)]))
        assert [p["phase"] for p in kube.patches] == ["Pending"] and kube.events == ["PodsStarting"]


def _in_a_burst(state: OperatorState) -> None:
    for _ in range(BURST_JOBS):
        state.burst.created()


async def _burst_rounds(
    steps: list[tuple[FineTuneJobStatus, Transition]], over: bool
) -> tuple[FakeKube, OperatorState]:
    """Rounds of one new job during a burst of new jobs; `over`: the burst ends before the last round."""
    kube = FakeKube()
    state = OperatorState(config=OperatorConfig(image="t"), kube=kube)  # type: ignore[arg-type]
    _in_a_burst(state)
    job = SimpleNamespace(namespace="ns", name="demo")
    for i, (status, transition) in enumerate(steps):
        if over and i == len(steps) - 1:
            state.burst.until = time.monotonic()
        body = {"metadata": {"namespace": "ns", "name": "demo"}, "status": {}}
        actions: Any = SimpleNamespace(status=status, transitions=[transition])
        await reconciling._write_status(state, body, job, actions)  # type: ignore[arg-type]
    return kube, state


def test_in_a_burst_a_new_jobs_first_running_waits_for_its_end_with_its_event() -> None:
    running = _with(_status("Running", 2), ("Created", "True"), ("PodsHealthy", "True"), ("Running", "True"))
    kube, state = asyncio.run(_burst_rounds([(running, READY)], over=False))
    assert kube.patches == [] and kube.events == []
    assert list(state.burst.held) == [("ns", "demo")] and state.wakeups.inbox.empty()  # the burst releases it
    kube, state = asyncio.run(_burst_rounds([(running, READY), (running, READY)], over=True))
    assert [p["phase"] for p in kube.patches] == ["Running"] and kube.events == ["AllNodesReady"]
    assert state.burst.held == {}


def test_in_a_burst_news_is_written_at_once() -> None:
    stuck = _with(_status("Pending", 0), ("Created", "True"), ("PodsHealthy", "False"))
    failed = _with(_status("Failed", 0), ("Created", "True"), ("Failed", "True"))
    for status in (stuck, failed):
        kube, state = asyncio.run(_burst_rounds([(status, STARTING)], over=False))
        assert [p["phase"] for p in kube.patches] == [status.phase] and state.burst.held == {}


def test_without_a_burst_a_new_jobs_first_running_is_written_at_once() -> None:
    running = _with(_status("Running", 2), ("Created", "True"), ("Running", "True"))
    kube, state = asyncio.run(_rounds([(running, READY)]))
    assert [p["phase"] for p in kube.patches] == ["Running"] and state.burst.held == {}
