"""One reconcile of one FineTuneJob: read it, observe its children, decide, apply, write status.

Every trigger (the job's own events, any event of its Jobs or pods, a deadline/TTL wake-up, the
safety timer) ends in `reconcile_job(state, key)`, which hands the job to the runtime's work queue
(`runtime.WorkQueue`: rounds of one job serialized and coalesced, a bounded number in flight) with
`_reconcile_once` as the round. An event-driven round reads the job as the watch last showed it,
which is never older than this process's own last status write (`runtime.Bodies`), so a decision
never rests on a status written a moment ago but not seen yet; timer wake-ups (deadlines, retries,
the resync safety net) re-read it from the API server.
"""

import asyncio
import logging
import math
import random
import time
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.status import TERMINAL_PHASES, FineTuneJobStatus
from finetune_operator import metrics
from finetune_operator.handlers.indexes import observe, owned_job
from finetune_operator.handlers.kube import Created, Existing, FieldConflictError, RejectedError
from finetune_operator.handlers.state import OperatorState
from finetune_operator.reconcile import Actions, claim, holder, namesake_wait, reconcile
from finetune_operator.runtime import Key, RetryLaterError
from finetune_operator.status import (
    ConflictReason,
    Transition,
    child_conflict,
    field_conflict_message,
    name_conflict_message,
    only_details_changed,
    only_started,
    only_starting,
)

log = logging.getLogger(__name__)
# Keys the progress endpoint owns; the reconciler never writes them, so it cannot undo a push.
PROGRESS_KEYS = frozenset({"progress", "output"})
RESYNC_JITTER = 0.1
# A change of only the ready count or messages waits a second, and is written at most once a second per job
# (`only_details_changed`): a burst's "1/2 ready" then goes out with the "Running" that follows it.
STATUS_BATCH_SECONDS = 1.0
# A new job's first status, "Pending, pods starting" (`only_starting`), waits up to two seconds with its event:
# an attempt's pods are created, scheduled and started in about one on an idle cluster and in one to three in
# a burst, and a Running that comes meanwhile is then the job's first status write and only event.
STARTING_STATUS_SECONDS = 2.0
FAILURE_REASONS = frozenset(
    {"InvalidSpec", "PermanentError", "BackoffLimitExceeded", "DeadlineExceeded", "NameConflict", "FieldConflict"}
)


class ChildConflictError(Exception):
    """A child the round must write is not (only) this job's: the job fails, nothing of it is touched."""

    def __init__(self, reason: ConflictReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def capture_indexes(state: OperatorState, kwargs: dict[str, Any]) -> None:
    """Remember kopf's index views (they are live objects) for triggers that are not handlers."""
    if not state.indexes:
        state.indexes.update({k: kwargs[k] for k in ("ftj_jobs", "ftj_pods", "ftj_configmaps", "ftj_services")})


async def reconcile_job(state: OperatorState, key: Key, reread: bool = False, urgent: bool = False) -> None:
    """Reconcile until no new trigger arrived meanwhile; triggers during a run are coalesced.

    `reread`: GET the job first instead of trusting the watch's view (the resync, retries after errors).
    `urgent`: the round goes before the others (a new job, or its spec changed: children to create).
    """
    round_ = lambda k, fresh: _reconcile_once(state, k, fresh)  # noqa: E731
    if await state.queue.run(key, round_, reread=reread, urgent=urgent):
        state.status_written.pop(key, None)  # the job is gone
        state.details_seen.pop(key, None)
        state.burst.forget(key)


def _entries(state: OperatorState, name: str, key: Key) -> list[Any]:
    index = state.indexes.get(name)
    return list(index.get(key, [])) if index is not None else []


async def _current_body(state: OperatorState, key: Key, reread: bool) -> dict[str, Any] | None:
    """The job as the watch last showed it; GET it when asked to (`reread`) or when it was never seen."""
    body = state.bodies.get(key)
    if body is None or reread:
        fetched = await state.kube.get_finetunejob(*key)
        if fetched is None:
            state.bodies.forget(key)
            return None
        state.bodies.offer(key, fetched)
        body = state.bodies.get(key)
    return body


async def _reconcile_once(state: OperatorState, key: Key, reread: bool = False) -> bool:
    """One round; False when the job is gone (or going)."""
    body = await _current_body(state, key, reread)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return False
    try:
        job = FineTuneJob.from_body(body)
    except InvalidSpecError as exc:  # CEL and the schema let it through, the model did not
        await _write_invalid(state, body, exc)
        return True
    job = job.model_copy(update={"status": _previous_status(body)})
    observed = observe(
        job.metadata.uid, *(_entries(state, n, key) for n in ("ftj_jobs", "ftj_pods", "ftj_configmaps", "ftj_services"))
    )
    now = datetime.now(UTC).replace(microsecond=0)
    options = state.config.render_options(job.namespace, job.name)
    actions = reconcile(job, observed, now, options, admitter=state.admissions, renderer=state.renders)
    created: list[Created] = []
    try:
        await _apply(state, job, actions, created)
    except RejectedError as exc:  # e.g. a template toleration the API server refuses: the spec, not luck
        await _undo(state, created)
        await _write_invalid(state, body, InvalidSpecError.from_message("spec.template", str(exc)))
        return True
    except ChildConflictError as exc:  # a child's name is taken by an object that is not this job's
        await _undo(state, created)
        result = child_conflict(job, actions.status.attempt, exc.reason, str(exc), now)
        await _write_status(state, body, job, Actions(status=result.status, transitions=result.transitions))
        return True
    await _write_status(state, body, job, actions)
    if actions.delete_self:
        log.info("deleting %s/%s: ttlSecondsAfterFinished passed", *key)
        await state.kube.delete_finetunejob(job.namespace, job.name, job.metadata.uid)
    elif actions.requeue_after is not None or actions.status.phase not in TERMINAL_PHASES:
        # Jittered, so the jobs of one burst do not all come back in the same second.
        resync = state.config.resync_seconds * random.uniform(1 - RESYNC_JITTER, 1)
        if actions.requeue_after is not None and actions.requeue_after < resync:
            state.wakeups.schedule(key, actions.requeue_after)  # a deadline or TTL: what we know is current
        else:
            state.wakeups.schedule(key, resync, reread=True)  # the safety net: does not trust the watch
    return True


def _previous_status(body: dict[str, Any]) -> FineTuneJobStatus:
    """The status as written last; a malformed one (hand-edited) counts as a fresh start."""
    try:
        return FineTuneJobStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return FineTuneJobStatus()


async def _apply(state: OperatorState, job: FineTuneJob, actions: Actions, created: list[Created]) -> None:
    """Children first (create the next attempt before deleting the failed one), then suspend.

    Every child this round creates is added to `created` as soon as it exists, so that a rejected or
    conflicting child can be rolled back (`_undo`) to exactly what this round made.
    """
    # ConfigMap and Service go out together, then the Job: a crash in between can then never leave a Job
    # (and pods) without its config, even if the job finishes before the operator is back. Both are
    # waited for even when one fails, so `created` is complete before a rollback reads it.
    outcomes = await asyncio.gather(
        *(_ensure(state, job, obj, created) for obj in actions.apply), return_exceptions=True
    )
    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if errors:  # a final answer (conflict, rejected) before a passing one (retry), so the job need not wait
        raise next((e for e in errors if isinstance(e, ChildConflictError | RejectedError)), errors[0])
    for obj in actions.create:
        if await _ensure(state, job, obj, created):
            log.info("[%s/%s] created Job %s", job.namespace, job.name, obj["metadata"]["name"])
            _expect(state, created[-1])
            state.burst.created()
            if actions.status.attempt == 1:
                metrics.JOBS_CREATED.labels(job.namespace).inc()
    for name in actions.delete_jobs:
        log.info("[%s/%s] deleting Job %s", job.namespace, job.name, name)
        await state.kube.delete("Job", job.namespace, name, actions.job_uids[name])
    for name, suspend in actions.suspend_jobs.items():
        log.info("[%s/%s] %s Job %s", job.namespace, job.name, "suspending" if suspend else "resuming", name)
        await state.kube.suspend_job(job.namespace, name, actions.job_uids[name], suspend)


def _expect(state: OperatorState, job: Created) -> None:
    """Note the attempt Job this round created as the change check (`runtime.ChildTriggers`) will see it in its
    first watch event, the create's answer: that event is then no news, since this round's status already
    counts the Job (`reconcile` computes the status of the cluster after the round). One round fewer per new
    attempt; a Job that changed before its event arrived still triggers one, as does its first event when it
    comes before this call (the check saw the uid first)."""
    body = job.body
    state.children.changed(str(body["metadata"]["uid"]), owned_job(body))


async def _ensure(state: OperatorState, job: FineTuneJob, obj: dict[str, Any], created: list[Created]) -> bool:
    """Make one child exist as the job's: True when this call created it.

    A child that carries its uid is already ours (observed) and is updated. Otherwise it is created; when
    the name is taken, the holder decides (`claim`): ours (the watch had not shown it yet) is updated, a
    deleted namesake's leftover is waited for, anything else fails the job. A Job is never updated: one
    of ours under the name is the attempt itself.
    """
    if obj["metadata"].get("uid"):
        await _update(state, obj)
        return False
    outcome = await state.kube.create(obj)
    if isinstance(outcome, Created):
        created.append(outcome)
        return True
    await _settle(state, job, obj, outcome)
    return False


async def _settle(state: OperatorState, job: FineTuneJob, obj: dict[str, Any], existing: Existing) -> None:
    """A create found the name taken: update it if it is ours, wait for a namesake's leftover, else fail."""
    whose = claim(existing.meta, job)
    if whose == "foreign":
        raise ChildConflictError(
            "NameConflict", name_conflict_message(existing.kind, existing.name, holder(existing.meta))
        )
    if whose == "namesake":
        delay = namesake_wait(existing.meta, datetime.now(UTC))
        raise RetryLaterError(
            f"{existing.kind} {existing.name} is a deleted FineTuneJob {job.name}'s, not yet garbage-collected",
            delay=delay,
        )
    log.debug("[%s/%s] %s %s exists and is ours", job.namespace, job.name, existing.kind, existing.name)
    if existing.kind != "Job":
        await _update(state, {**obj, "metadata": {**obj["metadata"], "uid": existing.meta["uid"]}})


async def _update(state: OperatorState, obj: dict[str, Any]) -> None:
    try:
        await state.kube.apply(obj)
    except FieldConflictError as exc:
        raise ChildConflictError("FieldConflict", field_conflict_message(exc.kind, exc.name, exc.detail)) from None


async def _undo(state: OperatorState, created: list[Created]) -> None:
    """Take back what this round created, and only that: each delete names the object by the uid its create
    answered with, so a rejected spec or a conflict leaves no half-made children and never removes another's."""
    for child in reversed(created):
        await state.kube.delete(child.kind, child.namespace, child.name, child.uid)


def _may_wait(old: dict[str, Any], new: dict[str, Any]) -> float:
    """How long a status change may wait for news (0: written now): a detail `STATUS_BATCH_SECONDS`, a new job's
    first "pods starting" `STARTING_STATUS_SECONDS`."""
    if only_details_changed(old, new):
        return STATUS_BATCH_SECONDS
    if only_starting(old, new):
        return STARTING_STATUS_SECONDS
    return 0.0


def _may_hold(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether a status change may wait for the end of a burst of new jobs (`runtime.Burst`): a detail, or a new
    job's first attempt starting with nothing wrong (`only_started`: "Pending, pods starting" or its first
    Running). News is written at once, burst or not."""
    return only_details_changed(old, new) or only_started(old, new)


async def _write_status(state: OperatorState, body: dict[str, Any], job: FineTuneJob, actions: Actions) -> None:
    """Patch only what changed (and never progress/output), then post one event per transition.

    A change that may wait (details: `STATUS_BATCH_SECONDS`; a new job's first status: `STARTING_STATUS_SECONDS`)
    is left to a wake-up, or to an earlier round with news; its transitions wait with it: they are taken against
    the written status, so the round that writes announces them (or the ones that replaced them: AllNodesReady
    instead of PodsStarting). During a burst of new jobs such a change, and a new job's first Running, waits
    further, for the burst's end (`_may_hold`, `runtime.Burst`), which releases it through a wake-up.
    """
    new = {k: v for k, v in actions.status.to_dict(exclude_none=True).items() if k not in PROGRESS_KEYS}
    old = body.get("status") or {}
    delta: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    delta |= {k: None for k, v in old.items() if k not in new and k not in PROGRESS_KEYS and v is not None}
    key = (job.namespace, job.name)
    now = time.monotonic()
    transitions = actions.transitions
    after = {**old, **delta}
    batch = _may_wait(old, after)
    if delta and (batch or _may_hold(old, after)):
        seen = state.details_seen.setdefault(key, now)
        wait = batch - min(now - state.status_written.get(key, -math.inf), now - seen)
        if state.burst.hold(key, seen, now):  # released by the burst's end (no wake-up of its own), or sooner
            delta, transitions = {}, []
        elif wait > 0:  # written by this wake-up, or sooner with news (a phase change) from another round
            state.wakeups.schedule(key, wait)
            delta, transitions = {}, []
    elif not delta:
        state.details_seen.pop(key, None)  # what waited is no longer a change
        state.burst.forget(key)
    if delta:
        await _patch_status(state, body, delta)
    for transition in transitions:
        await _announce(state, body, transition)


async def _announce(state: OperatorState, body: dict[str, Any], t: Transition) -> None:
    """A log line, an event and a metric per transition."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    level = logging.WARNING if t.type == "Warning" else logging.INFO
    log.log(level, "[%s/%s] %s: %s", ns, name, t.reason, t.message)
    await state.kube.post_event(body, t.type, t.reason, t.message)
    if t.reason == "Completed":
        metrics.JOBS_SUCCEEDED.labels(ns).inc()
    elif t.reason in FAILURE_REASONS:
        metrics.JOBS_FAILED.labels(ns, t.reason).inc()
    elif t.type == "Warning":
        metrics.JOBS_RESTARTED.labels(ns, t.reason).inc()


async def _write_invalid(state: OperatorState, body: dict[str, Any], exc: InvalidSpecError) -> None:
    """A body the model rejects: Failed/InvalidSpec with the field paths, once (sticky)."""
    if (body.get("status") or {}).get("phase") == "Failed":
        return
    now = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    message = f"invalid spec: {exc}"[:32768]
    condition = {
        "type": "Failed",
        "status": "True",
        "reason": "InvalidSpec",
        "message": message,
        "lastTransitionTime": now,
    }
    status = {
        "phase": "Failed",
        "conditions": [condition],
        "message": message,
        "completionTime": now,
        "observedGeneration": body["metadata"].get("generation"),
    }
    await _patch_status(state, body, status)
    await _announce(state, body, Transition("Warning", "InvalidSpec", message))


async def _patch_status(state: OperatorState, body: dict[str, Any], status: dict[str, Any]) -> None:
    """Write status and keep the answer: the next round must not read a body older than this write."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    written = await state.kube.patch_status(*key, status)
    state.status_written[key] = time.monotonic()
    state.details_seen.pop(key, None)
    state.burst.forget(key)
    if written is not None:
        state.bodies.offer(key, written)
