"""Burst: a burst starts with `BURST_JOBS` attempt Jobs created within a second, goes on while they (or new pods)
keep coming and ends `BURST_QUIET_SECONDS` after the last; a held write is released at its end, or after
`BURST_HOLD_MAX_SECONDS`, by one task."""

import asyncio
import time

from finetune_operator.runtime import Burst, Key
from finetune_operator.runtime.burst import BURST_HOLD_MAX_SECONDS, BURST_JOBS, BURST_QUIET_SECONDS

A: Key = ("ns", "a")
B: Key = ("ns", "b")


def _burst_at(start: float, jobs: int = BURST_JOBS, every: float = 0.1) -> Burst:
    burst = Burst()
    for i in range(jobs):
        burst.created(start + i * every)
    return burst


def test_a_few_jobs_or_jobs_now_and_then_make_no_burst() -> None:
    few = _burst_at(100.0, jobs=BURST_JOBS - 1)
    assert not few.on(100.5) and not few.hold(A, since=100.5, now=100.5)
    apart = _burst_at(100.0, jobs=20, every=0.5)  # two a second, for ten seconds
    assert not apart.on(105.1) and not apart.hold(A, since=105.1, now=105.1)
    assert apart.held == {}


def test_a_burst_goes_on_while_jobs_come_and_ends_a_quiet_spell_after_the_last() -> None:
    burst = _burst_at(100.0)
    last = 100.0 + (BURST_JOBS - 1) * 0.1
    assert burst.on(last)
    later = last + BURST_QUIET_SECONDS * 0.8
    burst.created(later)  # slower now, but before the burst ended: it goes on
    assert burst.on(later + BURST_QUIET_SECONDS - 0.01)
    assert not burst.on(later + BURST_QUIET_SECONDS)


def test_new_pods_keep_a_burst_on_but_start_none() -> None:
    idle = Burst()
    for i in range(3 * BURST_JOBS):
        idle.pod_created(100.0 + 0.01 * i)
    assert not idle.on(100.2)
    burst = _burst_at(100.0)
    last = 100.0 + (BURST_JOBS - 1) * 0.1
    burst.pod_created(last + BURST_QUIET_SECONDS - 0.1)  # the Job controller still makes the last pods
    assert burst.on(last + 2 * BURST_QUIET_SECONDS - 0.2)
    assert not burst.on(last + 2 * BURST_QUIET_SECONDS - 0.1)


def test_a_held_write_is_released_when_the_burst_ends_or_has_waited_longest() -> None:
    burst = _burst_at(100.0)
    now = 100.0 + (BURST_JOBS - 1) * 0.1
    assert burst.hold(A, since=now, now=now)
    assert burst.hold(B, since=now - BURST_HOLD_MAX_SECONDS + 1, now=now)  # has waited long already
    assert burst.due(now) == []
    for i in range(30):  # the burst goes on
        burst.created(now + 0.1 * i)
    assert burst.due(now + 1.0) == [B]  # its longest wait is over, the burst is not
    assert not burst.hold(B, since=now - BURST_HOLD_MAX_SECONDS + 1, now=now + 1.0)  # and it is not held again
    end = burst.until
    assert burst.due(end - 0.01) == []
    assert burst.due(end) == [A] and burst.held == {}


def test_a_job_released_after_its_longest_wait_is_not_held_again_until_written() -> None:
    burst = _burst_at(100.0)
    assert burst.hold(A, now=100.4)  # a child change of a new job: its round waits
    for i in range(200):  # a long burst
        burst.created(100.4 + 0.1 * i)
    assert burst.due(100.4 + BURST_HOLD_MAX_SECONDS) == [A]
    later = 100.5 + BURST_HOLD_MAX_SECONDS
    assert not burst.hold(A, since=later, now=later)  # its round's status change is written now
    burst.forget(A)  # written
    assert burst.hold(A, since=later, now=later)  # a later change waits again


def test_a_write_is_not_held_once_it_has_waited_longest() -> None:
    burst = _burst_at(100.0)
    assert not burst.hold(A, since=100.4 - BURST_HOLD_MAX_SECONDS, now=100.4)
    assert burst.held == {}


def test_forget_drops_a_held_write() -> None:
    burst = _burst_at(100.0)
    assert burst.hold(A, since=100.4, now=100.4)
    burst.forget(A)
    assert burst.held == {} and burst.waiting == {} and burst.next_due() is None


async def _released_by_the_task() -> list[Key]:
    burst = Burst(quiet=0.3)
    released: list[Key] = []
    task = asyncio.create_task(burst.run(released.append))
    for _ in range(BURST_JOBS):
        burst.created()
    assert burst.hold(A, since=time.monotonic())
    await asyncio.sleep(0.2)
    burst.created()  # the burst goes on: A stays held past its first end
    await asyncio.sleep(0.2)
    assert released == []
    await asyncio.sleep(0.4)
    task.cancel()
    return released


def test_the_task_releases_held_writes_once_the_burst_is_over() -> None:
    assert asyncio.run(_released_by_the_task()) == [A]
