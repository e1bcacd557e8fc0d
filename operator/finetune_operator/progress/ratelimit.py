"""Token buckets: a steady rate with a small burst per key, refused beyond it. Pure, injectable clock.

Three uses in the progress endpoint, each its own `RateLimiter`: per job for accepted pushes (each is a
status patch, so this protects the API server from a runaway or hostile pod), and, before any
TokenReview, per client address and for the whole endpoint (each review is an API call; an
unauthenticated flood must not turn into a review flood). The map of buckets is bounded: a bucket that
has refilled is the same as none and is dropped, and past `max_keys` the oldest go first.
"""

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field


@dataclass
class RateLimiter:
    """`rate` tokens per second per key, up to `burst` saved up; at most `max_keys` buckets kept."""

    rate: float = 1.0
    burst: float = 2.0
    clock: Callable[[], float] = time.monotonic
    max_keys: int = 10_000
    _buckets: dict[Hashable, tuple[float, float]] = field(default_factory=dict)

    def allow(self, key: Hashable = None) -> bool:
        """Take one token for `key`; False when the bucket is empty."""
        now = self.clock()
        tokens, last = self._buckets.pop(key, (self.burst, now))  # re-inserted below: newest last
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > self.max_keys:
            self._shrink(now)
        return allowed

    def _shrink(self, now: float) -> None:
        """Drop refilled buckets; if still too many, the least recently used half."""
        self._buckets = {
            k: (tokens, last)
            for k, (tokens, last) in self._buckets.items()
            if tokens + (now - last) * self.rate < self.burst
        }
        if len(self._buckets) > self.max_keys:
            keep = list(self._buckets.items())[len(self._buckets) - self.max_keys // 2 :]
            self._buckets = dict(keep)

    def __len__(self) -> int:
        return len(self._buckets)
