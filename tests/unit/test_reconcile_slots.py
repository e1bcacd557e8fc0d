"""reconcile_job: rounds of one job never overlap, at most `max_concurrent_reconciles` run at once over all
jobs, and the triggers a job gets while it waits for a slot are folded into a single round."""

import asyncio
from typing import Any

import pytest

from finetune_operator.handlers import reconciling
from finetune_operator.handlers.state import Key, OperatorConfig, OperatorState


async def _burst(monkeypatch: pytest.MonkeyPatch, slots: int) -> tuple[int, dict[str, int]]:
    state = OperatorState(config=OperatorConfig(image="t", max_concurrent_reconciles=slots), kube=None)  # type: ignore[arg-type]
    in_flight, peak, rounds = 0, 0, {}

    async def fake_round(state: Any, key: Key) -> bool:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        rounds[key[1]] = rounds.get(key[1], 0) + 1
        await asyncio.sleep(0.05)  # API calls
        in_flight -= 1
        return True

    monkeypatch.setattr(reconciling, "_reconcile_once", fake_round)
    triggers = [reconciling.reconcile_job(state, ("ns", f"job-{i}")) for i in range(6)]
    # job-5 waits for a slot while three more of its children's events arrive
    triggers += [reconciling.reconcile_job(state, ("ns", "job-5")) for _ in range(3)]
    await asyncio.gather(*triggers)
    return peak, rounds


def test_rounds_are_bounded_and_waiting_triggers_coalesce(monkeypatch: pytest.MonkeyPatch) -> None:
    peak, rounds = asyncio.run(_burst(monkeypatch, slots=2))
    assert peak == 2
    assert rounds == {f"job-{i}": 1 for i in range(6)}


def test_without_a_bound_all_jobs_run_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    peak, rounds = asyncio.run(_burst(monkeypatch, slots=100))
    assert peak == 6
    # job-5's later triggers arrive while its first round runs: folded into one more round, not three
    assert rounds == {**{f"job-{i}": 1 for i in range(5)}, "job-5": 2}
