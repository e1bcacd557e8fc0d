"""Whether this replica is the active one under kopf peering, for work that kopf does not drive.

kopf pauses its own handlers in a replica that sees a live peer of higher (or equal) priority, but
our wake-ups (deadlines, TTLs, resync) run in a task of our own. Before acting on one, a replica
reads the peering object and applies kopf's rule itself (`kopf/_core/engines/peering.py`), so two
replicas never both act. Standalone: always active. The answer is cached for a few seconds.
"""

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from finetune_operator.handlers.state import OperatorState

CACHE_SECONDS = 5.0


def outranked(status: dict[str, Any], identity: str, priority: int, now: datetime) -> bool:
    """kopf's rule: pause when any other live peer has a higher or the same priority."""
    for peer_id, info in (status or {}).items():
        if peer_id == identity:
            continue
        lastseen = datetime.fromisoformat(str(info.get("lastseen")))
        alive = lastseen + timedelta(seconds=int(info.get("lifetime", 60))) > now
        if alive and int(info.get("priority", 0)) >= priority:
            return True
    return False


async def active(state: OperatorState, namespace: str) -> bool:
    """True when this replica may act on jobs of `namespace` now."""
    config = state.config
    if not config.peering_name:
        return True
    scope = None if config.clusterwide else namespace
    cached = state.peer_cache.get(scope)
    if cached and cached[0] > time.monotonic():
        return cached[1]
    body = await state.kube.get_peering(config.peering_name, scope)
    status = (body or {}).get("status") or {}
    answer = not outranked(status, config.identity, config.priority, datetime.now(UTC))
    state.peer_cache[scope] = (time.monotonic() + CACHE_SECONDS, answer)
    return answer
