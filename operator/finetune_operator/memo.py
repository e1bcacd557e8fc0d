"""`Memo`: a bounded, least-recently-used memo, the one piece of machinery behind the reconcile loop's two caches.

A job is reconciled on every event of its children, but what a round computes from the spec changes only with the
spec: its admission (`admit.AdmissionCache`, keyed by uid, generation and pod policy) and its rendering
(`render.memo.RenderMemo`, which adds labels, attempt and options). Both keep the last `size` answers and count hits
and misses (the operator benchmark reads them); this class is that behaviour, once. Values are shared between
callers, who must not mutate them. Pure: no I/O.
"""

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class Memo(Generic[K, V]):
    """The last `size` values by key; the least recently used goes first."""

    size: int
    hits: int = 0
    misses: int = 0
    _entries: "OrderedDict[K, V]" = field(default_factory=OrderedDict)

    def get_or_compute(self, key: K, compute: Callable[[], V]) -> V:
        """The value kept for `key`, or `compute()`'s, kept."""
        if key in self._entries:
            self._entries.move_to_end(key)
            self.hits += 1
            return self._entries[key]
        self.misses += 1
        value = compute()
        self._entries[key] = value
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return value
