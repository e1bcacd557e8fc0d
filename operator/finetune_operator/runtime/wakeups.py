"""Delayed wake-ups (controller-runtime's RequeueAfter) for deadlines, TTLs, retries and the resync, in one task.

A round answers "look again in N seconds"; `Wakeups.schedule()` records that and a single background
task (`Wakeups.run`) calls back when it is due. Every active job also gets a slow resync wake-up (the
safety net for a missed event); that one, and retries after errors, re-read the job from the API
server (`reread`). The others act on what this process knows, which the watch and our own writes
keep current: a GET per wake-up was 0.9 GETs per job in a 100-job burst (the status-batching
wake-ups). One task for all jobs, not a kopf timer per job: thousands of jobs cost one heap, and
kopf timers would force a finalizer onto every FineTuneJob (deletion would then hang while the
operator is down).
"""

import asyncio
import heapq
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from finetune_operator.runtime.keys import Key
from finetune_operator.runtime.tasks import detach

MIN_DELAY = 0.2  # clock-skew floor, so a deadline is never checked a hair too early in a tight loop


Callback = Callable[[Key, bool], Coroutine[Any, Any, None]]
"""What a due wake-up calls: (key, reread: GET the job first instead of trusting the watch)."""


@dataclass
class Wakeups:
    """Requests for a later reconcile of a job, and the one task that serves them."""

    inbox: "asyncio.Queue[tuple[float, Key, bool]]" = field(default_factory=asyncio.Queue)
    """(due on the monotonic clock, key, reread), as asked; `run` moves them into its heap."""

    def schedule(self, key: Key, delay: float, *, reread: bool = False) -> None:
        """Ask for a reconcile of `key` after `delay` seconds; `reread`: that round GETs the job first."""
        self.inbox.put_nowait((time.monotonic() + max(delay, MIN_DELAY), key, reread))

    async def run(self, callback: Callback) -> None:
        """Forever: sleep until the earliest wake-up (or a new one arrives), then call back.

        Only the earliest wake-up per job is kept: the reconcile it triggers plans the next one anyway.
        """
        heap: list[tuple[float, Key]] = []
        earliest: dict[Key, tuple[float, bool]] = {}
        running: set[asyncio.Task[None]] = set()
        while True:
            timeout = max(heap[0][0] - time.monotonic(), 0.0) if heap else None
            try:
                due, key, reread = await asyncio.wait_for(self.inbox.get(), timeout)
            except TimeoutError:
                due, key = heapq.heappop(heap)
                planned = earliest.get(key)
                if planned is None or planned[0] != due:
                    continue  # superseded by an earlier wake-up that already ran
                del earliest[key]
                detach(running, callback(key, planned[1]), f"wake-up reconcile of {key[0]}/{key[1]}")
                continue
            if key not in earliest or due < earliest[key][0]:
                earliest[key] = (due, reread)
                heapq.heappush(heap, (due, key))
            elif due == earliest[key][0] and reread:
                earliest[key] = (due, True)
