"""A burst of new jobs: status writes that can wait are held until it is over, so they do not compete with it.

In a burst (many FineTuneJobs created within a second or so) every job needs its children (ConfigMap, Service,
attempt Job), and the Job controller and the scheduler need the API server for its pods; the jobs' status writes
("Running, 2/2 ready" and its event) are the one piece of the operator's API traffic that no child waits for. On
a small control plane they share the API server's cores with the creates: a FineTuneJob status patch costs it
about four ConfigMap creates, and each write comes back as a watch event to the operator and to the garbage
collector. In the 100-job bench burst the writes came a second or so after each job's create, in the middle
of the burst (bench/operator/README.md, "Status writes wait for the end of a burst").

`Burst` tells when a burst is on and holds the keys of the jobs whose writes wait for its end:

* a burst is on once `BURST_JOBS` attempt Jobs were created within `BURST_WINDOW_SECONDS`, and stays on until
  neither an attempt Job was created nor a new trainer pod appeared for `BURST_QUIET_SECONDS` (`created`,
  `pod_created`); one job created now and then, or a few at once, never starts one, so a single job's
  create -> Running path is unchanged;
* a write that may wait (the caller decides which: a new job's start, ready counts) is held (`hold`) until the
  burst is over, but never longer than `BURST_HOLD_MAX_SECONDS` after it began waiting, so a steady stream of
  creates delays statuses, and never starves them;
* one task (`run`) releases the held keys when they are due, through a callback (a wake-up of the job's
  round, which writes the status then), not one timer or round per job and check: a job held early in a
  7-second burst would otherwise come back every `BURST_QUIET_SECONDS` only to be held again.

What a held write costs: a job's status says it is Running up to `BURST_QUIET_SECONDS` after the burst's last
pod appeared (at most `BURST_HOLD_MAX_SECONDS` later than without the hold); its children and pods are not delayed.
News (a failure, a pod problem, a restart, a conflict) is never held.
"""

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from finetune_operator.runtime.keys import Key

BURST_JOBS = 5
"""Attempt Jobs created within `BURST_WINDOW_SECONDS` that make a burst (the bench's 10-job burst creates ten in
half a second; sequential single jobs, each waited for until Running, never come this close)."""
BURST_WINDOW_SECONDS = 1.0
BURST_QUIET_SECONDS = 1.0
"""A burst is over this long after its last attempt Job was created or its last new pod appeared: the Job
controller makes pods steadily while it has a backlog, so a second without one means it has none left."""
BURST_HOLD_MAX_SECONDS = 10.0
"""The longest a write is held from when it began waiting (a burst of 1,000 jobs lasts a minute or more)."""


@dataclass
class Burst:
    """Whether a burst of new attempt Jobs is on, and the jobs whose status writes wait for its end."""

    jobs: int = BURST_JOBS
    window: float = BURST_WINDOW_SECONDS
    quiet: float = BURST_QUIET_SECONDS
    longest: float = BURST_HOLD_MAX_SECONDS
    until: float = -math.inf
    """When the burst is over (monotonic clock); in the past when none is on."""
    held: dict[Key, float] = field(default_factory=dict)
    """Jobs whose write waits, each with its latest release time (when it began waiting + `longest`)."""
    waiting: dict[Key, float] = field(default_factory=dict)
    """Since when each held job has waited, kept past its release until it is written (`forget`): a job released
    after `longest` whose round is held again (a held child change, then its status) is not held twice."""
    _recent: deque[float] = field(default_factory=deque)
    _news: asyncio.Event = field(default_factory=asyncio.Event)

    def created(self, now: float | None = None) -> None:
        """An attempt Job was created now: a burst starts (or goes on) when `jobs` were created within `window`."""
        now = time.monotonic() if now is None else now
        self._recent.append(now)
        while self._recent and self._recent[0] <= now - self.window:
            self._recent.popleft()
        if len(self._recent) >= self.jobs or now < self.until:
            self.until = now + self.quiet

    def pod_created(self, now: float | None = None) -> None:
        """A new pod of an attempt Job appeared now: a burst that is on goes on (a pod starts none). The Job
        controller makes a burst's last pods a second or more after its last Job when it has a backlog, and
        the held writes must not compete with those either."""
        now = time.monotonic() if now is None else now
        if now < self.until:
            self.until = now + self.quiet

    def on(self, now: float | None = None) -> bool:
        """Whether a burst is on."""
        return (time.monotonic() if now is None else now) < self.until

    def hold(self, key: Key, since: float | None = None, now: float | None = None) -> bool:
        """Whether the write (or round) of `key` that may wait, and has waited since `since` (monotonic clock;
        default now), waits for the end of the burst: then `run` releases the key when the burst is over, or
        `longest` after it first began waiting, whichever comes first."""
        now = time.monotonic() if now is None else now
        start = self.waiting.get(key, now if since is None else since)
        if not self.on(now) or now - start >= self.longest:
            return False
        self.waiting[key] = start
        if key not in self.held:
            self.held[key] = start + self.longest
            self._news.set()
        return True

    def forget(self, key: Key) -> None:
        """The job's status was written (or the job is gone): nothing of it waits any more."""
        self.held.pop(key, None)
        self.waiting.pop(key, None)

    def due(self, now: float | None = None) -> list[Key]:
        """The held keys to release now (all of them once the burst is over), no longer held."""
        now = time.monotonic() if now is None else now
        keys = list(self.held) if not self.on(now) else [k for k, last in self.held.items() if last <= now]
        for key in keys:
            del self.held[key]
        return keys

    def next_due(self) -> float | None:
        """When `due` may next return a key (monotonic clock); None while nothing is held."""
        if not self.held:
            return None
        return min(self.until, *self.held.values())

    async def run(self, release: Callable[[Key], None]) -> None:
        """Forever: sleep until the burst ends or a held write reaches its longest wait, and release what is due.

        When the burst goes on past the time this loop slept for, it finds nothing due and sleeps again.
        """
        while True:
            self._news.clear()
            nxt = self.next_due()
            if nxt is None:
                await self._news.wait()
                continue
            delay = nxt - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._news.wait(), delay)
                continue
            for key in self.due():
                release(key)
