"""kopf handlers: every trigger that can change what a FineTuneJob needs ends in `reconcile_job`.

The job's own create/update/resume events and any event of its attempt Jobs and trainer pods
(found by the job-name label); deadlines, TTLs and the slow safety resync are wake-ups
(`requeue`), not kopf timers, so no finalizer is ever put on a FineTuneJob. Handlers are thin:
find the job's key, hand it to the reconciler, return None (a return value would land in `status.<id>` and be pruned).
"""

from typing import Any

import kopf

from finetune_operator import constants
from finetune_operator.handlers.indexes import CHILD_LABELS, key_of
from finetune_operator.handlers.reconciling import capture_indexes, reconcile_job
from finetune_operator.handlers.state import OperatorState

FTJ = (constants.GROUP, constants.VERSION, constants.PLURAL)


def _state(memo: kopf.Memo) -> OperatorState:
    state: OperatorState = memo["state"]
    return state


@kopf.on.create(*FTJ, id="finetunejob_create")
@kopf.on.update(*FTJ, id="finetunejob_update")
@kopf.on.resume(*FTJ, id="finetunejob_resume")
async def finetunejob_changed(
    body: kopf.Body, reason: str, namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    """The job was created or its spec/labels changed (or the operator restarted): reconcile it."""
    state = _state(memo)
    capture_indexes(state, kwargs)
    # A new job's body is as fresh as a re-read would be; later ones may predate our status writes.
    fresh = dict(body) if reason == kopf.Reason.CREATE else None
    await reconcile_job(state, (str(namespace), name), fresh)


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS, id="attempt_job_event")
async def attempt_job_event(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """An attempt's Job changed (created, suspended, failed, completed, deleted): reconcile its job."""
    state = _state(memo)
    capture_indexes(state, kwargs)
    await reconcile_job(state, key_of(body.meta))


@kopf.on.event("", "v1", "pods", labels=CHILD_LABELS, id="trainer_pod_event")
async def trainer_pod_event(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A trainer pod changed (scheduled, ready, failed, evicted): reconcile its job."""
    state = _state(memo)
    capture_indexes(state, kwargs)
    await reconcile_job(state, key_of(body.meta))
