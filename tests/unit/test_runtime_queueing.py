"""The work queue: rounds of one job never overlap, at most `slots` run at once over all jobs, the triggers a job
gets while it waits for a slot are folded into a single round, urgent rounds (a new job) get a slot before the
others, and a failed round becomes a wake-up (that re-reads the job) whose delay says why it failed."""

import asyncio

import pytest

from finetune_operator.runtime import Key, RetryLaterError, Wakeups, WorkQueue
from finetune_operator.runtime.queueing import CONNECTION_RETRY_SECONDS, ERROR_RETRY_SECONDS, Slots


async def _burst(slots: int) -> tuple[int, dict[str, int]]:
    queue = WorkQueue(slots=slots, wakeups=Wakeups())
    in_flight, peak, rounds = 0, 0, {}

    async def fake_round(key: Key, reread: bool) -> bool:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        rounds[key[1]] = rounds.get(key[1], 0) + 1
        await asyncio.sleep(0.05)  # API calls
        in_flight -= 1
        return True

    triggers = [queue.run(("ns", f"job-{i}"), fake_round) for i in range(6)]
    # job-5 waits for a slot while three more of its children's events arrive
    triggers += [queue.run(("ns", "job-5"), fake_round) for _ in range(3)]
    await asyncio.gather(*triggers)
    return peak, rounds


def test_rounds_are_bounded_and_waiting_triggers_coalesce() -> None:
    peak, rounds = asyncio.run(_burst(slots=2))
    assert peak == 2
    assert rounds == {f"job-{i}": 1 for i in range(6)}


def test_without_a_bound_all_jobs_run_at_once() -> None:
    peak, rounds = asyncio.run(_burst(slots=100))
    assert peak == 6
    # job-5's later triggers arrive while its first round runs: folded into one more round, not three
    assert rounds == {**{f"job-{i}": 1 for i in range(5)}, "job-5": 2}


async def _reread_flags() -> list[bool]:
    queue = WorkQueue(slots=1, wakeups=Wakeups())
    seen: list[bool] = []
    key = ("ns", "a")

    async def fake_round(key: Key, reread: bool) -> bool:
        seen.append(reread)
        if len(seen) == 1:  # a timer wake-up arrives while the event-driven round runs
            await queue.run(key, fake_round, reread=True)
        return True

    await queue.run(key, fake_round)
    await queue.run(key, fake_round)
    return seen


def test_a_wakeups_reread_reaches_the_next_round_only() -> None:
    assert asyncio.run(_reread_flags()) == [False, True, False]


async def _gone() -> tuple[bool, dict[Key, asyncio.Lock], set[Key]]:
    queue = WorkQueue(slots=1, wakeups=Wakeups())

    async def gone(key: Key, reread: bool) -> bool:
        return False

    forgot = await queue.run(("ns", "a"), gone)
    return forgot, queue.locks, queue.dirty


def test_a_gone_job_is_forgotten() -> None:
    forgot, locks, dirty = asyncio.run(_gone())
    assert forgot and locks == {} and dirty == set()


async def _order() -> list[str]:
    queue = WorkQueue(slots=1, wakeups=Wakeups())
    order: list[str] = []

    async def fake_round(key: Key, reread: bool) -> bool:
        order.append(key[1])
        await asyncio.sleep(0.01)
        return True

    first = asyncio.create_task(queue.run(("ns", "busy"), fake_round))
    await asyncio.sleep(0)  # "busy" holds the only slot
    waiting = [asyncio.create_task(queue.run(("ns", f"pod-event-{i}"), fake_round)) for i in range(3)]
    await asyncio.sleep(0)
    waiting.append(asyncio.create_task(queue.run(("ns", "new-job"), fake_round, urgent=True)))
    await asyncio.gather(first, *waiting)
    return order


def test_an_urgent_round_gets_the_next_slot_before_earlier_waiters() -> None:
    assert asyncio.run(_order()) == ["busy", "new-job", "pod-event-0", "pod-event-1", "pod-event-2"]


async def _cancelled_waiter() -> tuple[int, bool]:
    slots = Slots(1)
    await slots.acquire(urgent=False)
    waiter = asyncio.create_task(slots.acquire(urgent=True))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    slots.release()  # the cancelled waiter must not swallow the slot
    late = asyncio.create_task(slots.acquire(urgent=False))
    await asyncio.sleep(0)
    return slots.free, late.done()


def test_a_cancelled_waiter_does_not_take_a_slot_with_it() -> None:
    assert asyncio.run(_cancelled_waiter()) == (0, True)


async def _failure(error: Exception) -> list[tuple[float, Key, bool]]:
    wakeups = Wakeups()
    queue = WorkQueue(slots=1, wakeups=wakeups)

    async def failing(key: Key, reread: bool) -> bool:
        raise error

    start = asyncio.get_running_loop().time()
    assert not await queue.run(("ns", "a"), failing)
    filed = []
    while not wakeups.inbox.empty():
        due, key, reread = wakeups.inbox.get_nowait()
        filed.append((round(due - start), key, reread))
    return filed


@pytest.mark.parametrize(
    ("error", "delay"),
    [
        (RetryLaterError("namesake's children not yet collected", delay=7), 7),
        (ConnectionResetError("peer closed"), CONNECTION_RETRY_SECONDS),
        (KeyError("a bug"), ERROR_RETRY_SECONDS),
    ],
)
def test_a_failed_round_is_filed_as_one_wakeup_after_the_delay_its_cause_asks_for(
    error: Exception, delay: float
) -> None:
    assert asyncio.run(_failure(error)) == [(round(delay), ("ns", "a"), True)]
