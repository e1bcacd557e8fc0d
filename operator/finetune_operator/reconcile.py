"""Pure reconciliation: desired children of a job versus what was observed, as a list of actions.

`reconcile(job, observed, now, options)` runs one round in three steps, each once: admit the job
(`finetune_operator.admit`: valid? which memory plan?), ask `compute_status` what state it is in and
which attempt is current, then render that attempt's children (`finetune_operator.render`) and answer
which to create, delete or (un)suspend, when to look again, and whether the job itself is due for
deletion (TTL). A finished or invalid job is never rendered. The same inputs always give the same
actions, so a restarted operator or a duplicate event never duplicates a child. It must not do
I/O or import kopf or a Kubernetes client; `handlers` applies the actions.

Order matters for crash safety: the next attempt's Job is created before the failed one is
deleted, so the highest attempt seen on the cluster is always the current one.

Ownership: children have fixed names (`<job>-config`, `<job>`, `<job>-<attempt>`), so the name may
already be taken by an object that is not this job's. The handlers never take such an object over:
a child is created with a plain create, and only an object whose controlling owner is this job's uid
(`claim`) is ever updated, deleted or suspended, each write carrying that object's uid as a
precondition. Anything else is a `NameConflict` that fails the job and touches nothing.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from finetune_api import constants
from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.status import TERMINAL_PHASES, FineTuneJobStatus
from finetune_operator.admit import Admitter, admit
from finetune_operator.render import RenderContext, Rendered, RenderOptions, render
from finetune_operator.render.names import attempt_job_name
from finetune_operator.status import (
    STUCK_AFTER,
    AttemptObserved,
    Observed,
    StatusResult,
    Transition,
    compute_status,
)

TEMPLATE_HASH = f"{constants.GROUP}/template-hash"
Claim = Literal["ours", "namesake", "foreign"]
NAMESAKE_WAIT_SECONDS = (1.0, 30.0)
"""A deleted namesake's leftover is looked at again after 1 s, up to 30 s while a finalizer holds it."""
Renderer = Callable[[RenderContext], Rendered]
"""`render` (tests inject a wrapper to count or inspect the renderings)."""


@dataclass(frozen=True)
class Actions:
    """What the handlers must do, in this order: apply, create, delete, suspend, then write status."""

    status: FineTuneJobStatus
    transitions: list[Transition]
    apply: list[dict[str, Any]] = field(default_factory=list)
    """ConfigMap and Service: created when they carry no `metadata.uid`; with one, they are already this
    job's and are updated (server-side apply without force, the uid a precondition)."""
    create: list[dict[str, Any]] = field(default_factory=list)  # create if absent (attempt Jobs)
    delete_jobs: list[str] = field(default_factory=list)
    suspend_jobs: dict[str, bool] = field(default_factory=dict)
    job_uids: dict[str, str] = field(default_factory=dict)
    """The uid of each observed attempt Job (all this job's), by name: deletes and suspends carry it."""
    requeue_after: float | None = None
    delete_self: bool = False
    invalid: bool = False


def owned(obj: dict[str, Any], job: FineTuneJob, uid: str | None = None) -> dict[str, Any]:
    """The child with the job as its controlling owner, so deleting the job deletes it (GC).

    `uid`: the child already exists as this job's (observed); the update then names it by uid.
    """
    meta = {**obj["metadata"], "uid": uid} if uid else obj["metadata"]
    ref = {
        "apiVersion": job.api_version,
        "kind": job.kind,
        "name": job.name,
        "uid": job.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {**obj, "metadata": {**meta, "ownerReferences": [ref]}}


def controller_ref(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The controlling owner reference of an object, if any (at most one may say `controller: true`)."""
    return next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None)


def claim(meta: Mapping[str, Any], job: FineTuneJob) -> Claim:
    """Whose an object found under one of the job's child names is.

    `ours`: controlled by this job (its uid): update it. `namesake`: controlled by a FineTuneJob of the
    same name but another uid, i.e. by a deleted job of this name (only one can exist at a time): the
    garbage collector is removing it, so wait. `foreign`: anything else, also an object with no owner:
    never touched.
    """
    ref = controller_ref(meta)
    if ref is None:
        return "foreign"
    if job.metadata.uid and ref.get("uid") == job.metadata.uid:
        return "ours"
    if (ref.get("apiVersion"), ref.get("kind"), ref.get("name")) == (job.api_version, job.kind, job.name):
        return "namesake"
    return "foreign"


def holder(meta: Mapping[str, Any]) -> str:
    """Who controls an object, in words (for the NameConflict message)."""
    ref = controller_ref(meta)
    if ref is None:
        return "it has no controlling owner"
    return f"it is controlled by {ref.get('kind')} {ref.get('name')}"


def namesake_wait(meta: Mapping[str, Any], now: datetime) -> float:
    """When to look again at a deleted namesake's leftover: in a second while the garbage collector has
    yet to delete it, less and less often once it is deleted but held by a finalizer (at most every 30 s)."""
    low, high = NAMESAKE_WAIT_SECONDS
    since = meta.get("deletionTimestamp")
    if not since:
        return low
    age = (now - datetime.fromisoformat(str(since))).total_seconds()
    return min(max(low, age / 10), high)


def _job_uids(observed: Observed) -> dict[str, str]:
    return {a.name: a.uid for a in observed.attempts.values() if a.uid}


def _seconds(delta: timedelta) -> float:
    return max(delta.total_seconds(), 0.0)


def _terminal(job: FineTuneJob, observed: Observed, result: StatusResult, now: datetime) -> Actions:
    """Stop what still runs (deadline), never create anything, and honour the TTL.

    Earlier attempts are deleted too: a crash between creating attempt n+1 and deleting attempt n
    leaves both, and the job may be finished by the time the operator is back.
    """
    status = result.status
    running = [
        a.name
        for n, a in sorted(observed.attempts.items())
        if not a.deleting and (not a.finished or n < status.attempt)
    ]
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    requeue, delete_self = None, False
    if ttl is not None and status.completion_time is not None:
        left = status.completion_time + timedelta(seconds=ttl) - now
        delete_self = left.total_seconds() <= 0
        requeue = None if delete_self else _seconds(left)
    return Actions(
        status=status,
        transitions=result.transitions,
        delete_jobs=running,
        job_uids=_job_uids(observed),
        requeue_after=requeue,
        delete_self=delete_self,
        invalid=result.invalid,
    )


def with_template_hash(attempt_job: dict[str, Any], digest: str) -> dict[str, Any]:
    """The attempt Job annotated with `digest`, the hash of its spec (`render.spec_digest`; a rendering keeps
    it as `Rendered.job_digest`), to notice a spec edited while suspended."""
    meta = attempt_job["metadata"]
    return {**attempt_job, "metadata": {**meta, "annotations": {**meta.get("annotations", {}), TEMPLATE_HASH: digest}}}


def _outdated(current: AttemptObserved, desired: dict[str, Any]) -> bool:
    """A suspended, unfinished Job rendered from an older spec (the spec may change only while suspended).

    Its pod template is immutable, so it is replaced (same attempt, not a restart) rather than resumed.
    """
    want = desired["metadata"]["annotations"][TEMPLATE_HASH]
    live = current.suspended and not current.finished and not current.deleting
    return live and current.template_hash is not None and current.template_hash != want


def desired_suspend(job: FineTuneJob) -> bool | None:
    """The attempt Job's `spec.suspend`: ours when runPolicy says so; Kueue's when the job is queued."""
    if job.spec.run_policy.suspend:
        return True
    if job.metadata.labels.get(constants.KUEUE_QUEUE_LABEL):
        return None
    return False


def reconcile(
    job: FineTuneJob,
    observed: Observed,
    now: datetime,
    options: RenderOptions,
    *,
    admitter: Admitter = admit,
    renderer: Renderer = render,
) -> Actions:
    """Everything needed to move the cluster toward the job's spec.

    `admitter`: `admit` or the operator's `AdmissionCache` (called once, with the options' pod policy);
    `renderer`: `render`, called at most once, for the attempt the status decided.
    """
    admission = admitter(job, options.policy)
    result = compute_status(job, observed, now, admission)
    status = result.status
    if status.phase in TERMINAL_PHASES:
        return _terminal(job, observed, result, now)
    if isinstance(admission, InvalidSpecError):  # unreachable: compute_status fails an invalid job
        raise RuntimeError(f"{job.name}: an invalid job is not terminal")
    attempt = status.attempt
    rendered = renderer(RenderContext(job, admission, attempt, options))
    apply = []
    if observed.config_map != rendered.config_map["data"]:
        apply.append(owned(rendered.config_map, job, observed.config_map_uid))
    if not observed.service:
        apply.append(owned(rendered.service, job))
    current = observed.attempts.get(attempt)
    attempt_job = with_template_hash(owned(rendered.job, job), rendered.job_digest)
    create = [attempt_job] if current is None else []
    if create and result.reason == "Creating":
        # The status describes the cluster after this round, which creates the Job (the status is written only
        # after it was): one status write per new job, not "Creating" now and "PodsStarting" a moment later.
        new = AttemptObserved(
            attempt, attempt_job_name(job, attempt), suspended=bool(attempt_job["spec"].get("suspend"))
        )
        after = replace(observed, attempts={**observed.attempts, attempt: new})
        result = compute_status(job, after, now, admission)
        status = result.status
    stale = [a.name for n, a in sorted(observed.attempts.items()) if n < attempt and not a.deleting]
    suspend: dict[str, bool] = {}
    want = desired_suspend(job)
    if current is not None and _outdated(current, attempt_job):
        stale.append(current.name)  # recreated from the edited spec once it is gone
    elif current is not None and not current.finished and want is not None and current.suspended != want:
        suspend[attempt_job_name(job, attempt)] = want
    wakeups = []
    deadline = job.spec.run_policy.active_deadline_seconds
    if status.start_time is not None and deadline is not None:
        wakeups.append(_seconds(status.start_time + timedelta(seconds=deadline) - now))
    if current is not None and current.failing_since is not None:
        wakeups.append(_seconds(current.failing_since + STUCK_AFTER - now))
    requeue = min(wakeups, default=None)
    return Actions(
        status=status,
        transitions=result.transitions,
        apply=apply,
        create=create,
        delete_jobs=stale,
        suspend_jobs=suspend,
        job_uids=_job_uids(observed),
        requeue_after=requeue,
    )
