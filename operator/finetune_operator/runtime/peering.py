"""Whether this replica is the active one under kopf peering, for work that kopf does not drive (`PeeringGate`).

kopf pauses its own handlers in a replica that sees a live peer of higher (or equal) priority, but our
wake-ups (deadlines, TTLs, retries, resync) run in a task of our own. Before acting on one, a replica
reads the peering object and applies kopf's rule itself (`outranked`, a copy of the decision in
`kopf/_core/engines/peering.py::process_peering_event`), so two replicas never both act. A copy, not a
call: kopf's function also cleans dead peers, toggles its pause and sleeps; the decision is five lines.
`tests/unit/test_runtime_peering.py` compares the copy with kopf's own on the pinned kopf version.
Standalone: always active. The answer is cached for a few seconds.
"""

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

CACHE_SECONDS = 5.0
DEFAULT_LIFETIME_SECONDS = 60  # kopf's Peer default when a peer's entry has no lifetime

FetchPeering = Callable[[str, str | None], Awaitable[dict[str, Any] | None]]
"""(peering object name, namespace or None for the cluster-wide one) -> the object, None when absent."""


def _lastseen(value: Any, now: datetime) -> datetime:
    """A peer's last keep-alive; kopf takes a missing one as now (a peer that just appeared)."""
    if value is None:
        return now
    seen = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return seen if seen.tzinfo else seen.replace(tzinfo=UTC)


def outranked(status: Mapping[str, Any], identity: str, priority: int, now: datetime) -> bool:
    """kopf's rule: pause when any other live peer has a higher or the same priority.

    A peer is live until lastseen + lifetime (kopf: dead when that deadline <= now).
    """
    for peer_id, info in (status or {}).items():
        if peer_id == identity:
            continue
        lifetime = timedelta(seconds=int(info.get("lifetime", DEFAULT_LIFETIME_SECONDS)))
        alive = _lastseen(info.get("lastseen"), now) + lifetime > now
        if alive and int(info.get("priority", 0)) >= priority:
            return True
    return False


@dataclass
class PeeringGate:
    """Answers "may this replica act on jobs of a namespace now?" for our own tasks."""

    peering_name: str | None
    """The (Cluster)KopfPeering object's name; None: standalone, always active."""
    identity: str
    priority: int
    clusterwide: bool
    fetch: FetchPeering
    cache: dict[str | None, tuple[float, bool]] = field(default_factory=dict)

    async def active(self, namespace: str) -> bool:
        """True when this replica may act on jobs of `namespace` now."""
        if not self.peering_name:
            return True
        scope = None if self.clusterwide else namespace
        cached = self.cache.get(scope)
        if cached and cached[0] > time.monotonic():
            return cached[1]
        body = await self.fetch(self.peering_name, scope)
        status = (body or {}).get("status") or {}
        answer = not outranked(status, self.identity, self.priority, datetime.now(UTC))
        self.cache[scope] = (time.monotonic() + CACHE_SECONDS, answer)
        return answer
