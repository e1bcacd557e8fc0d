"""The newest body of each FineTuneJob this process has seen (`Bodies`), so a round need not GET it.

kopf hands every event's body to the event handler and forgets it; a round triggered by a child's event
(or queued behind others) would otherwise GET the job first: 6.3 GETs per job in the 1,000-job burst
(bench/operator/README.md), each ~2 ms of API-server CPU on a machine where the API server is the
bottleneck. The cache is filled from the job's watch events and from the answers to our own status
writes, so it is never older than this process's last write.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from finetune_operator.runtime.keys import Key


def _resource_version(body: Mapping[str, Any]) -> int | None:
    try:
        return int(body["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


@dataclass
class Bodies:
    """The newest body of each FineTuneJob this process has seen: from its watch events and from the
    answers to our own status writes (managedFields dropped: ~12 KB a job).

    A round triggered by an event reads it instead of GETting the job. It is never older than our last
    status write: of two bodies, the one with the higher resourceVersion wins (etcd revisions; a version
    that is not a number defers to arrival order).
    """

    latest: dict[Key, dict[str, Any]] = field(default_factory=dict)

    def offer(self, key: Key, body: Mapping[str, Any]) -> None:
        known = self.latest.get(key)
        new, old = _resource_version(body), _resource_version(known) if known is not None else None
        if known is not None and new is not None and old is not None and new < old:
            return  # an event older than a status write of ours that we already hold
        meta = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
        self.latest[key] = {**body, "metadata": meta}

    def get(self, key: Key) -> dict[str, Any] | None:
        return self.latest.get(key)

    def forget(self, key: Key) -> None:
        self.latest.pop(key, None)
