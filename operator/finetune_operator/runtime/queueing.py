"""The work queue: one round of a job at a time, triggers coalesced, a bounded number of rounds in flight.

controller-runtime's workqueue semantics, without its worker pool: the task that brings a trigger (a
kopf event handler, a wake-up) runs the job's rounds itself, under a per-job lock, so kopf's per-object
workers keep their order. A trigger that arrives while the job's round runs (or waits for a slot) only
marks the job dirty (`WorkQueue.dirty`), and the running task goes round again: at N = 1,000 jobs each job
gets a dozen child events (Job and pod changes) while it waits, and they cost one round, not twelve.
At most `slots` rounds are in flight over all jobs (controller-runtime's MaxConcurrentReconciles): a
round is a few API calls, and more at once only queue at the API server.

Slots go to urgent rounds first (`Slots`): a job that is new (or whose spec changed) waits for its
children behind no round that only updates another job's status from a pod event. In a burst every
job's pod and Job events bring such rounds, and with first-come slots a job created late in the burst
queued behind them (bench/operator/README.md, "the tail after the last create").

A round that fails is never fatal: it is filed as a wake-up (`Wakeups`) that re-reads the job, after
a delay that depends on why (`RetryLaterError` says how long; a dropped connection 1 s; anything
else, a bug, 5 s and a traceback).
"""

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from finetune_operator import metrics
from finetune_operator.runtime.errors import RetryLaterError
from finetune_operator.runtime.keys import Key
from finetune_operator.runtime.wakeups import Wakeups

log = logging.getLogger(__name__)
ERROR_RETRY_SECONDS = 5.0
CONNECTION_RETRY_SECONDS = 1.0
# A round is a handful of API calls (well under a second); one stuck this long is abandoned and retried.
RECONCILE_TIMEOUT_SECONDS = 60.0

Round = Callable[[Key, bool], Awaitable[bool]]
"""One reconcile round of a job: (key, reread: GET the job instead of trusting the watch) -> whether the
job is still there (False: gone or going; the queue forgets it)."""


class Slots:
    """A semaphore whose waiters are served urgent first, then in arrival order (asyncio's serves arrival order)."""

    def __init__(self, slots: int) -> None:
        self.free = slots
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    async def acquire(self, urgent: bool) -> None:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (0 if urgent else 1, next(self._order), granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release()  # granted, but cancelled before it could be used: pass it on
            raise

    def release(self) -> None:
        while self._waiters:
            _, _, granted = heapq.heappop(self._waiters)
            if not granted.done():  # a cancelled waiter is skipped
                granted.set_result(None)
                return
        self.free += 1


@dataclass
class WorkQueue:
    """Per-job serialization and coalescing of reconcile rounds, with a bound on rounds in flight."""

    slots: int
    """Rounds in flight at once, over all jobs."""
    wakeups: Wakeups
    """Where a failed round's retry is filed."""
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    dirty: set[Key] = field(default_factory=set)
    """Jobs with a trigger that no round has started on yet."""
    reread: set[Key] = field(default_factory=set)
    """Jobs whose next round must GET the job (the resync: the safety net must not trust the watch)."""
    urgent: set[Key] = field(default_factory=set)
    """Jobs whose next round goes before the others (new, or spec changed: children to create)."""
    _slots: Slots = field(init=False)

    def __post_init__(self) -> None:
        self._slots = Slots(self.slots)

    async def run(self, key: Key, round_: Round, *, reread: bool = False, urgent: bool = False) -> bool:
        """Run rounds of `key` until no new trigger arrived meanwhile; a trigger during a run is coalesced.

        Returns True when this call found the job gone and forgot it (the caller forgets its own per-job
        state then); False otherwise, also when another task already runs the job's rounds.
        """
        self.dirty.add(key)
        if reread:
            self.reread.add(key)
        if urgent:
            self.urgent.add(key)
        lock = self.locks.setdefault(key, asyncio.Lock())
        if lock.locked():
            return False
        async with lock:
            while key in self.dirty:
                # When the API server is the bottleneck, a job waiting here gathers its triggers into one round.
                asked = time.monotonic()
                await self._slots.acquire(key in self.urgent)
                try:
                    started = time.monotonic()
                    self.dirty.discard(key)
                    self.urgent.discard(key)
                    fresh = key in self.reread
                    self.reread.discard(key)
                    alive = await self._guarded(key, round_, fresh)
                    log.debug(
                        "[%s/%s] round: %.3f s waiting for a slot, %.3f s running",
                        *key,
                        started - asked,
                        time.monotonic() - started,
                    )
                finally:
                    self._slots.release()
                if alive is None:
                    return False
                if not alive:
                    self.locks.pop(key, None)
                    self.dirty.discard(key)
                    self.urgent.discard(key)
                    return True
        return False

    async def _guarded(self, key: Key, round_: Round, reread: bool) -> bool | None:
        """One round: whether the job is still there, or None when it failed and a retry is filed."""
        try:
            with metrics.RECONCILE_SECONDS.time():
                return await asyncio.wait_for(round_(key, reread), RECONCILE_TIMEOUT_SECONDS)
        except RetryLaterError as exc:  # API hiccup: look again soon, whatever triggered us
            log.warning("[%s/%s] reconcile will be retried: %s", *key, exc)
            self.wakeups.schedule(key, exc.delay or CONNECTION_RETRY_SECONDS, reread=True)
        except (aiohttp.ClientError, OSError) as exc:
            # A dropped or refused connection, or a round past RECONCILE_TIMEOUT_SECONDS (TimeoutError is an
            # OSError): a hung API call must not hold this job's lock (and status) forever.
            log.warning(
                "[%s/%s] API server did not answer (%s); retrying in %s s",
                *key,
                type(exc).__name__,
                CONNECTION_RETRY_SECONDS,
            )
            self.wakeups.schedule(key, CONNECTION_RETRY_SECONDS, reread=True)
        except Exception:  # a bug or an unexpected answer: logged, retried later, never fatal
            log.exception("[%s/%s] reconcile failed; retrying in %s s", *key, ERROR_RETRY_SECONDS)
            self.wakeups.schedule(key, ERROR_RETRY_SECONDS, reread=True)
        return None
