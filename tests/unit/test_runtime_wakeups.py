"""Wake-ups: one slow reconcile must not hold back another job's wake-up (the stale-Pending symptom
seen in the 300-job burst: the single wake-up task awaited each reconcile inline)."""

import asyncio
import time

from finetune_operator.runtime import Key, Wakeups


async def _run() -> dict[str, float]:
    wakeups = Wakeups()
    woke: dict[str, float] = {}
    start = time.monotonic()

    async def callback(key: Key) -> None:
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
