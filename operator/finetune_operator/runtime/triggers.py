"""Which of a FineTuneJob's own events call for a reconcile (`Triggers`).

The job's events reach us through `kopf.on.event` (kopf's on.create/update made it deep-copy every
event's body for a diff-base and patch an annotation per job: 16% of the operator's CPU and one API
write per job in a burst). Most of those events are our own status writes and progress pushes, which
change nothing a reconcile reads; this check lets through only the first sighting and changes of uid,
generation (the spec), labels or deletion.
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
