"""kopf handlers: every trigger that can change what a FineTuneJob needs ends in `reconcile_job`.

The job's own events (first sighting, spec or label changes: urgent, the job may need children) and
the events of its attempt Jobs and trainer pods (found by the job-name label) that change what a
round reads of them (`runtime.ChildTriggers`, on the index's summary of the child); deadlines, TTLs
and the slow safety resync are wake-ups (`runtime.Wakeups`), not kopf timers, so no finalizer is
ever put on a FineTuneJob. Handlers are thin: find the job's key, hand it to the reconciler, return
None.

The job's own events come through `kopf.on.event`, not `on.create/update/resume`: those made kopf
keep a diff-base for every event (a deep copy of the body) and write a `last-handled-configuration`
annotation patch per job, 16% of the operator's CPU and one API write per job in a burst; the
check that replaces them is `runtime.Triggers.changed`.
"""

from typing import Any

import kopf

from finetune_api import constants
from finetune_operator import metrics
from finetune_operator.handlers.indexes import (
    CHILD_LABELS,
    Owned,
    key_of,
    owned_job,
    owned_pod,
    pod_trigger,
    waiting_arrival,
)
from finetune_operator.handlers.reconciling import capture_indexes, reconcile_job
from finetune_operator.handlers.state import OperatorState
from finetune_operator.runtime import ChildTriggers, Triggers

FTJ = (constants.GROUP, constants.VERSION, constants.PLURAL)


def _state(memo: kopf.Memo) -> OperatorState:
    state: OperatorState = memo["state"]
    return state


@kopf.on.event(*FTJ, id="finetunejob_event")
async def finetunejob_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """First sighting (created, or listed at start), spec or labels changed, or deleting: reconcile it.

    Every event refreshes the job's body for later rounds; those of our own status writes and of
    progress pushes change nothing a reconcile reads besides, and trigger none.
    """
    state = _state(memo)
    capture_indexes(state, kwargs)
    key = (str(body.meta.namespace), str(body.meta.name))
    metrics.JOB_SERIES.job_event(*key, deleted=type == "DELETED", phase=(body.get("status") or {}).get("phase"))
    if type == "DELETED":
        state.triggers.forget(key)
        state.bodies.forget(key)
        return
    state.bodies.offer(key, body)
    if state.triggers.changed(key, Triggers.signature(body)):
        await reconcile_job(state, key, urgent=True)


def _news(children: ChildTriggers, type: str | None, owned: Owned) -> bool:
    """Whether a child's event changes what a round reads of it; a deleted child always does."""
    if type == "DELETED":
        children.forget(owned.uid)
        return True
    return children.changed(owned.uid, owned)


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS, id="attempt_job_event")
async def attempt_job_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """An attempt's Job changed (created, suspended, failed, completed, deleted): reconcile its job."""
    state = _state(memo)
    capture_indexes(state, kwargs)
    if _news(state.children, type, owned_job(body)):
        await reconcile_job(state, key_of(body.meta))


@kopf.on.event("", "v1", "pods", labels=CHILD_LABELS, id="trainer_pod_event")
async def trainer_pod_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A trainer pod changed (ready, failed, evicted, or a scheduler or kubelet problem): reconcile its job; being
    bound to a node alone is no news (`pod_trigger`), nor is a new pod that only waits (`waiting_arrival`). A pod
    that goes also loses its place in the progress endpoint's cache of accepted tokens."""
    state = _state(memo)
    capture_indexes(state, kwargs)
    if state.progress_auth is not None and (type == "DELETED" or body.meta.get("deletionTimestamp")):
        state.progress_auth.forget_pod(str(body.meta.uid))
    owned = owned_pod(body)
    arrival = type != "DELETED" and not state.children.knows(owned.uid) and waiting_arrival(owned)
    if _news(state.children, type, pod_trigger(owned)) and not arrival:
        await reconcile_job(state, key_of(body.meta))
