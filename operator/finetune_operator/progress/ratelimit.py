"""Per-job token bucket for progress pushes: a steady rate with a small burst, 429 beyond it.

The trainer pushes every few seconds; the limit protects the API server (each accepted push is a
status patch) from a runaway or hostile pod. Pure, with an injectable clock.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RateLimiter:
    """`rate` tokens per second per key, up to `burst` saved up."""

    rate: float = 1.0
    burst: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def allow(self, key: tuple[str, str]) -> bool:
        """Take one token for `key`; False when the bucket is empty."""
        now = self.clock()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) > 10_000:  # forget idle jobs so the map stays bounded
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 3600}
        return True
