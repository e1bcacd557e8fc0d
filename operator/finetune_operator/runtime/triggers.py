"""Which events call for a reconcile: of a FineTuneJob itself (`Triggers`), of its children (`ChildTriggers`).

The job's events reach us through `kopf.on.event` (kopf's on.create/update made it deep-copy every
event's body for a diff-base and patch an annotation per job: 16% of the operator's CPU and one API
write per job in a burst). Most of those events are our own status writes and progress pushes, which
change nothing a reconcile reads; this check lets through only the first sighting and changes of uid,
generation (the spec), labels or deletion.

A child's events (attempt Jobs, trainer pods) call for a round only when what the round reads of the
child changed: the summary its index keeps (`handlers/indexes.py`). Most of a child's events change
nothing there (a Job's active and ready counts, a pod's probe times and IPs), and in a 1,000-job burst
each was a round (a pydantic validation of the job, the pure reconcile, a status diff) competing for a
slot with the jobs that still wait for their children. The handlers narrow it further (`handlers/indexes.py`:
a pod's node is left out, a new pod that only waits is no news, and a round notes the Job it created as its
first event will show it): 8-9 rounds per job in a burst became about 4.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from finetune_operator.runtime.keys import Key

Signature = tuple[str, int, tuple[tuple[str, str], ...], bool]


@dataclass
class Triggers:
    """What of each FineTuneJob the reconciler last reacted to: the parts a reconcile depends on
    besides its own status (uid, generation = spec, labels, being deleted)."""

    seen: dict[Key, Signature] = field(default_factory=dict)

    @staticmethod
    def signature(body: Mapping[str, Any]) -> Signature:
        meta = body["metadata"]
        labels = tuple(sorted((meta.get("labels") or {}).items()))
        return str(meta.get("uid")), int(meta.get("generation") or 0), labels, bool(meta.get("deletionTimestamp"))

    def changed(self, key: Key, signature: Signature) -> bool:
        """True (and remembered) when the job is new to this process or differs from the last sighting."""
        if self.seen.get(key) == signature:
            return False
        self.seen[key] = signature
        return True

    def forget(self, key: Key) -> None:
        self.seen.pop(key, None)


@dataclass
class ChildTriggers:
    """What of each child (by uid) the reconciler last reacted to: the summary its index keeps."""

    seen: dict[str, object] = field(default_factory=dict)

    def knows(self, uid: str) -> bool:
        """Whether this process has seen the child before (and not forgotten it)."""
        return uid in self.seen

    def changed(self, uid: str, summary: object) -> bool:
        """True (and remembered) when the child is new to this process or its summary differs from the last."""
        if uid in self.seen and self.seen[uid] == summary:
            return False
        self.seen[uid] = summary
        return True

    def forget(self, uid: str) -> None:
        self.seen.pop(uid, None)
