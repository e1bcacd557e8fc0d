"""Wake-ups: one slow reconcile must not hold back another job's wake-up (the stale-Pending symptom
seen in the 300-job burst: the single wake-up task awaited each reconcile inline), and only a wake-up that
asked to re-read the job (the resync) does."""

import asyncio
import time

from finetune_operator.runtime import Key, Wakeups


async def _run() -> dict[str, float]:
    wakeups = Wakeups()
    woke: dict[str, float] = {}
    start = time.monotonic()

    async def callback(key: Key, reread: bool) -> None:
        woke[key[1]] = time.monotonic() - start
        if key[1] == "slow":
            await asyncio.sleep(5)  # a reconcile stuck on a saturated API server

    loop = asyncio.create_task(wakeups.run(callback))
    wakeups.schedule(("ns", "slow"), 0.2)
    wakeups.schedule(("ns", "fast"), 0.4)
    wakeups.schedule(("ns", "fast"), 3.0)  # a later wake-up for the same job is dropped
    await asyncio.sleep(1.0)
    loop.cancel()
    return woke


def test_a_slow_wakeup_does_not_block_the_others() -> None:
    woke = asyncio.run(_run())
    assert set(woke) == {"slow", "fast"}
    assert woke["fast"] < 1.0, woke


async def _rereads() -> dict[str, bool]:
    wakeups = Wakeups()
    woke: dict[str, bool] = {}

    async def callback(key: Key, reread: bool) -> None:
        woke[key[1]] = reread

    loop = asyncio.create_task(wakeups.run(callback))
    wakeups.schedule(("ns", "resync"), 0.2, reread=True)
    wakeups.schedule(("ns", "batched-status"), 0.2)
    wakeups.schedule(("ns", "deadline"), 0.3)
    wakeups.schedule(("ns", "deadline"), 0.6, reread=True)  # later: dropped with its flag
    await asyncio.sleep(0.9)
    loop.cancel()
    return woke


def test_only_the_wakeup_that_fires_says_whether_to_reread() -> None:
    assert asyncio.run(_rereads()) == {"resync": True, "batched-status": False, "deadline": False}
