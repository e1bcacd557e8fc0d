"""Delayed wake-ups (controller-runtime's RequeueAfter) for deadlines and TTLs, in one task.

`reconcile` answers "look again in N seconds"; `schedule()` records that and a single background
task calls back when it is due. Every active job also gets a slow resync wake-up (the safety net
for a missed event). One task for all jobs, not a kopf timer per job: thousands of jobs cost one
heap, and kopf timers would force a finalizer onto every FineTuneJob (deletion would then hang
while the operator is down).
"""

import asyncio
import heapq
import logging
import time
from collections.abc import Awaitable, Callable

from finetune_operator.handlers.state import Key, OperatorState

log = logging.getLogger(__name__)
MIN_DELAY = 0.2  # clock-skew floor, so a deadline is never checked a hair too early in a tight loop


def schedule(state: OperatorState, key: Key, delay: float) -> None:
    """Ask for a reconcile of `key` after `delay` seconds."""
    state.wakeups.put_nowait((time.monotonic() + max(delay, MIN_DELAY), key))


async def run_wakeups(state: OperatorState, callback: Callable[[Key], Awaitable[None]]) -> None:
    """Forever: sleep until the earliest wake-up (or a new one arrives), then call back.

    Only the earliest wake-up per job is kept: the reconcile it triggers plans the next one anyway.
    """
    heap: list[tuple[float, Key]] = []
    earliest: dict[Key, float] = {}
    while True:
        timeout = max(heap[0][0] - time.monotonic(), 0.0) if heap else None
        try:
            due, key = await asyncio.wait_for(state.wakeups.get(), timeout)
        except TimeoutError:
            due, key = heapq.heappop(heap)
            if earliest.get(key) != due:
                continue  # superseded by an earlier wake-up that already ran
            del earliest[key]
            try:
                await callback(key)
            except Exception:  # a failed wake-up must not stop the others
                log.exception("wake-up reconcile of %s/%s failed", *key)
            continue
        if key not in earliest or due < earliest[key]:
            earliest[key] = due
            heapq.heappush(heap, (due, key))
