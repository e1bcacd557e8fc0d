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

A child's change reaches us through one kopf callback per event, its index function (`ftj_jobs`,
`ftj_pods`), not an index plus a `kopf.on.event` handler: kopf runs each callback through its handler
machinery (a progress state, an outcome, the kwargs): 0.227 ms of kopf's CPU per pod event with both, 0.191 ms
now (bench/operator/kopf_event_cost.py), and pods and Jobs are 9 of the 13 watch events of a job in a burst.
The index function keeps what kopf's indexes promise (filled before any handler runs; a deleted child's
entry removed) and asks for a round once the operator is indexed (`OperatorState.indexed`); the round runs
in a task of its own (`_soon`), since kopf stores the index entry only when the function returns and the
round must read it. kopf does not call index functions for deletions, so a deleted child comes through
`child_deleted`, an event handler that kopf calls for DELETED events only (its `when` filter costs a
fraction of a call).
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
    routine,
    waiting_arrival,
)
from finetune_operator.handlers.reconciling import capture_indexes, reconcile_job
from finetune_operator.handlers.state import OperatorState
from finetune_operator.runtime import Key, Triggers, detach
from finetune_operator.status import only_starting

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
    state.indexed = True  # kopf calls handlers only once every index is filled
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


def _starting(state: OperatorState, key: Key) -> bool:
    """Whether the job's written status says no more than that it is new: nothing yet, or "Pending, pods
    starting" (`status.only_starting`)."""
    status = (state.bodies.get(key) or {}).get("status") or {}
    return not status.get("phase") or only_starting({}, status)


def _soon(state: OperatorState, key: Key, routine: bool = False) -> None:
    """A round of `key` in a task of its own, once the operator is indexed (before that, the first-sighting
    round of every FineTuneJob, which kopf runs only after all indexes are filled, reads the child anyway).
    A task, not an await: kopf stores the index function's answer when it returns, and the round reads it.

    `routine`: the child's change could only move a new job's status in a way that may wait (`indexes.routine`);
    during a burst of new jobs the round of a job that is itself new then waits for the burst's end, which
    releases one round for all of the job's child changes meanwhile (`runtime.Burst`), instead of a round per
    pod or Job event whose status write would be held anyway."""
    if not state.indexed:
        return
    if routine and _starting(state, key) and state.burst.hold(key):
        return
    detach(state.triggered, reconcile_job(state, key), f"child event reconcile of {key[0]}/{key[1]}")


@kopf.index("batch", "v1", "jobs", labels=CHILD_LABELS)
async def ftj_jobs(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> dict[Key, Owned]:
    """Attempt Jobs by owning FineTuneJob; a change (created, suspended, failed, completed) reconciles its job."""
    state = _state(memo)
    capture_indexes(state, kwargs)
    owned = owned_job(body)
    key = key_of(body.meta)
    if state.children.changed(owned.uid, owned):
        _soon(state, key, routine(owned))
    return {key: owned}


@kopf.index("", "v1", "pods", labels=CHILD_LABELS)
async def ftj_pods(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> dict[Key, Owned]:
    """Trainer pods by FineTuneJob (the owner uid here is the attempt Job's). A change (ready, failed, evicted,
    a scheduler or kubelet problem) reconciles its job; being bound to a node alone is no news (`pod_trigger`),
    nor is a new pod that only waits (`waiting_arrival`). A new pod keeps a burst of new jobs on
    (`runtime.Burst.pod_created`). A pod that is going also loses its place in the progress endpoint's cache of
    accepted tokens."""
    state = _state(memo)
    capture_indexes(state, kwargs)
    if state.progress_auth is not None and body.meta.get("deletionTimestamp"):
        state.progress_auth.forget_pod(str(body.meta.uid))
    owned = owned_pod(body)
    key = key_of(body.meta)
    new = not state.children.knows(owned.uid)
    if new:
        state.burst.pod_created()
    arrival = new and waiting_arrival(owned)
    if state.children.changed(owned.uid, pod_trigger(owned)) and not arrival:
        _soon(state, key, routine(owned))
    return {key: owned}


def _deleted(type: str | None, **_: Any) -> bool:
    """`child_deleted`'s kopf filter: deletions only (a filter is cheaper for kopf than a call of the handler)."""
    return type == "DELETED"


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS, when=_deleted, id="attempt_job_deleted")
@kopf.on.event("", "v1", "pods", labels=CHILD_LABELS, when=_deleted, id="trainer_pod_deleted")
async def child_deleted(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """An attempt Job or a trainer pod is gone: kopf has dropped it from its index; reconcile its job."""
    state = _state(memo)
    state.indexed = True
    capture_indexes(state, kwargs)
    state.children.forget(str(body.meta.uid))
    if state.progress_auth is not None:  # a Job's uid is in no pod entry: a no-op for Jobs
        state.progress_auth.forget_pod(str(body.meta.uid))
    await reconcile_job(state, key_of(body.meta))
