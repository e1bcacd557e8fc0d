"""Pure status: fold what the operator observed (the attempt Jobs and their pods) into the status.

`compute_status(job, observed, now, admission)` is the one place that decides the phase, the attempt
number and every condition (`PodsHealthy` from the pods' problems, as `health` reads them); `reconcile`
turns its answer into child actions, the handlers write it and post its transitions as events. It
owns the restart, permanent-error, deadline, suspend and Kueue rules. It must not do I/O, log, or
import kopf, a Kubernetes client or an HTTP library: it returns reasons and messages instead.
Terminal phases (Succeeded, Failed) are sticky.

It reads the job's admission (`finetune_operator.admit`: the memory plan, or the InvalidSpecError that fails the
job) and never renders: the attempt it decides is what `reconcile` renders next, so the renderers come after it
(an import-linter contract keeps `finetune_operator.render` out of this module).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from finetune_api import constants
from finetune_api.termination import PERMANENT_MEANINGS, TerminationRecord
from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.status import TERMINAL_PHASES, Condition, FineTuneJobStatus, Phase, PlanSummary
from finetune_operator.admit import Admission
from finetune_operator.health import PodProblem, PodsHealth, pods_health
from finetune_operator.plan import Plan
from finetune_operator.planreport import memory_quantity

STUCK_AFTER = timedelta(seconds=constants.TERMINATION_GRACE_SECONDS + 60)
FAIL_JOB_REASON = "PodFailurePolicy"
"""The Job controller's reason for a Job failed by a podFailurePolicy FailJob rule; the attempt Job's only such
rule is the trainer's permanent exit codes (render/workload.py), so this reason alone means "permanent"."""
DETAIL_LIMIT = 512  # characters of the trainer's own message quoted in the status
_NODE_LOST_REASONS = frozenset({"NodeLost", "Evicted", "DeletionByTaintManager", "TerminationByKubelet"})
ConflictReason = Literal["NameConflict", "FieldConflict"]


@dataclass(frozen=True)
class PodObserved:
    """One trainer pod of an attempt, as much as the status needs."""

    name: str
    phase: str = "Pending"
    ready: bool = False
    exit_code: int | None = None
    reason: str | None = None
    node: str | None = None
    deleting: bool = False
    termination: TerminationRecord | None = None  # the trainer's record, from the container's termination message
    problem: PodProblem | None = None  # what the scheduler or kubelet says keeps it from running (`health`)


@dataclass(frozen=True)
class AttemptObserved:
    """One attempt's Indexed Job and its pods."""

    attempt: int
    name: str
    suspended: bool = False
    deleting: bool = False
    complete: bool = False
    failed: bool = False
    failed_reason: str | None = None
    failed_message: str | None = None
    template_hash: str | None = None
    failing_since: datetime | None = None  # the Job's FailureTarget: failed, pods still terminating
    pods: tuple[PodObserved, ...] = ()
    uid: str | None = None  # the Job's own uid: every delete or patch of it carries it as a precondition

    @property
    def ready(self) -> int:
        return sum(1 for p in self.pods if p.phase == "Running" and p.ready and not p.deleting)

    @property
    def finished(self) -> bool:
        """Done, or decided to fail (its pods may still be terminating): never suspended or stopped."""
        return self.complete or self.failed or self.failing_since is not None


@dataclass(frozen=True)
class Observed:
    """Everything the operator saw of a job's children (owned by this job's uid)."""

    attempts: dict[int, AttemptObserved] = field(default_factory=dict)
    config_map: dict[str, str] | None = None
    config_map_uid: str | None = None  # an update of the ConfigMap carries it as a precondition
    service: bool = False


@dataclass(frozen=True)
class Transition:
    """A change worth a Kubernetes event (and a log line)."""

    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class StatusResult:
    """The new status plus what changed, for events and metrics."""

    status: FineTuneJobStatus
    transitions: list[Transition]
    invalid: bool = False
    reason: str | None = None


@dataclass(frozen=True)
class FailureCause:
    """Why an attempt failed, and whether retrying could help."""

    reason: str
    message: str
    permanent: bool = False


@dataclass(frozen=True)
class _Verdict:
    phase: Phase
    reason: str
    message: str
    attempt: int


def _stuck(attempt: AttemptObserved, now: datetime) -> bool:
    """Failed for the Job controller, but its pods have not terminated within the grace period.

    Pods on a dead node stay Terminating until the node is gone, and the Job only gets `Failed` once
    they terminate (kubeflow/trainer#2072): past the trainer's own SIGTERM grace, restart anyway.
    """
    return attempt.failing_since is not None and now >= attempt.failing_since + STUCK_AFTER


def _permanent_target(attempt: AttemptObserved) -> bool:
    """A permanent exit code is final at once: nothing new starts, so there is nothing to wait for."""
    return attempt.failing_since is not None and failure_cause(attempt).permanent


_NOT_RETRIED = "not retried: fix the spec or the data and re-create the job"


def failure_cause(attempt: AttemptObserved) -> FailureCause:
    """Why an attempt failed: the container's exit code says whether it is permanent (the Job's FailJob reason
    says so when the pod is gone), the trainer's termination record says what was wrong."""
    failed = [p for p in attempt.pods if p.phase == "Failed" or p.exit_code not in (None, 0)]
    # The culprit first: pods killed with SIGTERM (143) were mostly stopped because another one failed.
    failed.sort(key=lambda p: (p.exit_code in (None, constants.EXIT_SIGTERM), p.name))
    for pod in failed:
        if pod.exit_code in constants.EXIT_PERMANENT_CODES:
            what = _trainer_words(pod.termination) or PERMANENT_MEANINGS[pod.exit_code]
            text = f"trainer in pod {pod.name} exited with permanent error code {pod.exit_code} ({what})"
            return FailureCause("PermanentError", f"{text}; {_NOT_RETRIED}", permanent=True)
    if attempt.failed_reason == FAIL_JOB_REASON:
        text = f"Job {attempt.name} failed on a permanent trainer exit code ({attempt.failed_message}); {_NOT_RETRIED}"
        return FailureCause("PermanentError", text, permanent=True)
    for pod in failed:
        if pod.reason in _NODE_LOST_REASONS:
            why = pod.problem.text if pod.problem is not None else pod.reason
            return FailureCause("NodeLost", f"pod {pod.name} on node {pod.node or '?'} was lost ({why})")
    for pod in failed:
        if pod.exit_code not in (None, 0):
            # The kubelet's word first: an OOM kill says more than the exit code 137 the trainer never saw coming.
            kubelet = pod.problem.text if pod.problem else None
            what = kubelet or _trainer_words(pod.termination) or pod.reason or "Error"
            return FailureCause("PodFailed", f"pod {pod.name} exited with code {pod.exit_code} ({what})")
    detail = attempt.failed_message or attempt.failed_reason or "unknown reason"
    return FailureCause("AttemptFailed", f"Job {attempt.name} failed: {detail}")


def _trainer_words(record: TerminationRecord | None) -> str | None:
    """`BadDatasetError: data.textField 'x' is not a column ...` from the trainer's record, if it left one."""
    if record is None or not (record.reason or record.message):
        return None
    return ": ".join(part for part in (record.reason, record.message[:DETAIL_LIMIT]) if part)


def _verdict(job: FineTuneJob, observed: Observed, now: datetime) -> _Verdict:
    """The phase of a valid, non-terminal job: the restart/deadline/suspend/Kueue rules in order."""
    prev = job.status
    policy = job.spec.run_policy
    nodes = job.spec.distributed.nodes
    attempt = max([prev.attempt, 1, *observed.attempts])
    current = observed.attempts.get(attempt)
    if current is not None and current.complete:
        return _Verdict("Succeeded", "Completed", f"attempt {attempt} completed on {nodes} node(s)", attempt)
    if current is not None and (current.failed or _stuck(current, now) or _permanent_target(current)):
        cause = failure_cause(current)
        reason, message = cause.reason, cause.message
        if cause.permanent:
            return _Verdict("Failed", reason, message, attempt)
        if attempt - 1 >= policy.backoff_limit:
            limit = (
                f"backoffLimit {policy.backoff_limit} restart(s) used up; check the pods' logs "
                f"(kubectl logs -l finetune.dev/job-name={job.name}) or raise runPolicy.backoffLimit"
            )
            return _Verdict("Failed", "BackoffLimitExceeded", f"attempt {attempt} failed: {message}; {limit}", attempt)
        restart = f"restart {attempt} of {policy.backoff_limit}"
        text = f"attempt {attempt} failed: {message}; starting attempt {attempt + 1} ({restart})"
        return _Verdict("Restarting", reason, text, attempt + 1)
    deadline = policy.active_deadline_seconds
    if prev.start_time and deadline is not None and now >= prev.start_time + timedelta(seconds=deadline):
        text = (
            f"ran longer than runPolicy.activeDeadlineSeconds ({deadline} s); pods stopped, checkpoints kept; "
            "raise the deadline and re-create the job to resume from the last checkpoint"
        )
        return _Verdict("Failed", "DeadlineExceeded", text, attempt)
    if policy.suspend:
        text = "suspended by runPolicy.suspend: pods deleted, checkpoints kept; set suspend: false to resume"
        return _Verdict("Suspended", "Suspended", text, attempt)
    queue = job.metadata.labels.get(constants.KUEUE_QUEUE_LABEL)
    if queue and (current is None or current.suspended):
        return _Verdict("Pending", "WaitingForAdmission", f"waiting for Kueue admission in queue {queue}", attempt)
    if current is None or current.deleting:
        return _Verdict("Pending", "Creating", f"creating attempt {attempt}", attempt)
    ready = current.ready
    done = sum(1 for p in current.pods if p.phase == "Succeeded")
    if ready + done >= nodes and not current.suspended:
        return _Verdict("Running", "AllNodesReady", f"attempt {attempt}: {ready}/{nodes} node(s) running", attempt)
    waiting = f"attempt {attempt}: {ready}/{nodes} node(s) ready"
    if prev.phase == "Running" and prev.attempt == attempt and not current.suspended:
        return _Verdict("Running", prev_reason(prev, "Running"), waiting, attempt)  # a blip is not a new phase
    if prev.phase == "Restarting":
        return _Verdict("Restarting", prev_reason(prev, "Restarting"), f"{waiting} after restart", attempt)
    return _Verdict("Pending", "PodsStarting", waiting, attempt)


def prev_reason(status: FineTuneJobStatus, ctype: str) -> str:
    """The reason of a condition in the previous status (to keep it steady across passes)."""
    for cond in status.conditions:
        if cond.type == ctype:
            return cond.reason
    return ctype


def _set(conditions: list[Condition], ctype: str, status: str, reason: str, message: str, now: datetime) -> None:
    """Set one condition in place; the transition time moves only when the status flips."""
    for i, cond in enumerate(conditions):
        if cond.type == ctype:
            moved = cond.status != status
            conditions[i] = cond.model_copy(
                update={
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "last_transition_time": now if moved else cond.last_transition_time,
                }
            )
            return
    conditions.append(Condition(type=ctype, status=status, reason=reason, message=message, last_transition_time=now))


def _conditions(
    prev: FineTuneJobStatus, v: _Verdict, created: bool, now: datetime, health: PodsHealth | None = None
) -> list[Condition]:
    conditions = [c.model_copy() for c in prev.conditions]
    if created:
        _set(conditions, "Created", "True", "ChildrenCreated", f"attempt {v.attempt} created", now)
    if health is not None:
        _set(conditions, "PodsHealthy", health.status, health.reason, health.message, now)
    suspended = v.phase == "Suspended" or v.reason == "WaitingForAdmission"
    active = {"Running": v.phase == "Running", "Restarting": v.phase == "Restarting", "Suspended": suspended}
    for ctype, is_true in active.items():
        if is_true:
            _set(conditions, ctype, "True", v.reason, v.message, now)
        elif any(c.type == ctype and c.status == "True" for c in conditions):
            _set(conditions, ctype, "False", "Resumed" if ctype == "Suspended" else v.reason, v.message, now)
    if v.phase in TERMINAL_PHASES:
        _set(conditions, v.phase, "True", v.reason, v.message, now)
    return conditions


def plan_summary(plan: Plan) -> PlanSummary:
    """What `status.plan` says of the memory planner's choice."""
    return PlanSummary.model_validate(
        {
            "zeroStage": plan.strategy.zero_stage,
            "offload": plan.strategy.offload,
            "estimatedGPUMemory": memory_quantity(plan.estimate.peak_gib),
            "reason": plan.reason[:1024],
            "gradientCheckpointing": plan.checkpointing_summary[:512],
        }
    )


def compute_status(job: FineTuneJob, observed: Observed, now: datetime, admission: Admission) -> StatusResult:
    """The job's next status and the transitions since the previous one.

    `admission`: the job's `admit` answer (under the operator's pod policy); an InvalidSpecError fails the job.
    """
    prev = job.status
    generation = job.metadata.generation
    if prev.phase in TERMINAL_PHASES:
        return StatusResult(prev.model_copy(update={"ready_nodes": 0}), [])
    if isinstance(admission, InvalidSpecError):
        fields = ", ".join(sorted({e.path for e in admission.errors}))
        v = _Verdict("Failed", "InvalidSpec", f"invalid spec ({fields}): {admission}"[:32768], prev.attempt)
        status = prev.model_copy(
            update={
                "phase": "Failed",
                "conditions": _conditions(prev, v, False, now),
                "observed_generation": generation,
                "completion_time": now,
                "message": v.message,
            }
        )
        return StatusResult(status, [Transition("Warning", "InvalidSpec", v.message)], invalid=True, reason=v.reason)
    v = _verdict(job, observed, now)
    current = observed.attempts.get(v.attempt)
    start_time = _start_time(prev, v, current, now)
    health = _health(prev, observed, v)
    if current is not None and health is not None and not health.healthy and v.phase not in TERMINAL_PHASES:
        # Waiting for pods (Pending, Running short of a node, Restarting into a new attempt): say why.
        v = replace(v, message=f"{v.message}; {health.message}"[:32768])
    status = prev.model_copy(
        update={
            "phase": v.phase,
            "conditions": _conditions(prev, v, current is not None or v.attempt > 1, now, health),
            "attempt": v.attempt,
            "observed_generation": generation,
            "start_time": start_time,
            "completion_time": now if v.phase in TERMINAL_PHASES else None,
            "ready_nodes": current.ready if current is not None and v.phase not in TERMINAL_PHASES else 0,
            "nodes": job.spec.distributed.nodes,
            "plan": plan_summary(admission.plan),
            "restarts": v.attempt - 1,
            "message": v.message,
        }
    )
    return StatusResult(status, _transitions(prev, v), reason=v.reason)


def _health(prev: FineTuneJobStatus, observed: Observed, v: _Verdict) -> PodsHealth | None:
    """The `PodsHealthy` condition: the current attempt's pods; while the next attempt's Job is yet to be
    created, those of the attempt that just failed (an OOM kill stays in view until the restart). None (no
    condition yet) until the first pod exists: before that there is nothing to speak of."""
    attempt = observed.attempts.get(v.attempt) or observed.attempts.get(v.attempt - 1)
    if attempt is None or not (attempt.pods or any(c.type == "PodsHealthy" for c in prev.conditions)):
        return None
    return pods_health((pod.name, pod.problem) for pod in attempt.pods)


def child_conflict(job: FineTuneJob, attempt: int, reason: ConflictReason, message: str, now: datetime) -> StatusResult:
    """Failed with `NameConflict` or `FieldConflict`: an object the job would write is not (only) its own.

    Final like `InvalidSpec`: retrying would only ask the API server the same question again, and the
    operator never takes the object over. The message says what to do (`name_conflict_message`)."""
    prev = job.status
    v = _Verdict("Failed", reason, message[:32768], max(attempt, prev.attempt, 1))
    status = prev.model_copy(
        update={
            "phase": "Failed",
            "conditions": _conditions(prev, v, False, now),
            "attempt": v.attempt,
            "observed_generation": job.metadata.generation,
            "completion_time": now,
            "ready_nodes": 0,
            "message": v.message,
        }
    )
    return StatusResult(status, [Transition("Warning", reason, v.message)], reason=reason)


def name_conflict_message(kind: str, name: str, holder: str) -> str:
    """Which object is in the way, whose it is, and what to do."""
    return (
        f"{kind} {name} already exists and is not this job's ({holder}); the operator leaves it untouched: "
        f"delete this FineTuneJob and create it again under another name (or remove {kind} {name} first)"
    )


def field_conflict_message(kind: str, name: str, detail: str) -> str:
    """Fields of the job's own child that another field manager set to other values."""
    return (
        f"{kind} {name} belongs to this job, but another field manager holds fields the operator must "
        f"change ({detail}); the operator does not overwrite them: delete {kind} {name} and this "
        "FineTuneJob, then create the job again"
    )


def _start_time(
    prev: FineTuneJobStatus, v: _Verdict, current: AttemptObserved | None, now: datetime
) -> datetime | None:
    """Start of the current running period: cleared while suspended, so a resume restarts the deadline."""
    if v.phase == "Suspended" or v.reason == "WaitingForAdmission":
        return None
    if prev.start_time is not None:
        return prev.start_time
    return now if current is not None and not current.suspended and not current.finished else None


def _transitions(prev: FineTuneJobStatus, v: _Verdict) -> list[Transition]:
    """One event per phase change, and per new attempt while restarting."""
    if prev.phase == v.phase and prev.attempt == v.attempt and prev.message is not None:
        return []
    warning = v.phase in ("Failed", "Restarting")
    return [Transition("Warning" if warning else "Normal", v.reason, v.message)]


DETAIL_KEYS = frozenset({"readyNodes", "message", "conditions"})


def only_details_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Between two written statuses, only the ready count and messages moved: same phase, attempt and
    condition states. Such a change may wait a moment (the Job controller batches its pod counts the
    same way); anything else is news and is written at once. A `PodsHealthy` condition that says all is
    well is a detail too: it appears with a job's first pod, and in a burst writing it at once was one
    status patch per job more; a problem (False) is news, and so is its end."""

    def shape(status: Mapping[str, Any]) -> tuple[Any, ...]:
        conditions = [
            (c.get("type"), c.get("status"), c.get("reason"))
            for c in status.get("conditions") or []
            if (c.get("type"), c.get("status")) != ("PodsHealthy", "True")
        ]
        return status.get("phase"), status.get("attempt"), conditions

    changed = {k for k in {*old, *new} if old.get(k) != new.get(k)}
    return bool(changed) and changed <= DETAIL_KEYS and shape(old) == shape(new)


def only_starting(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """A new job's first status that says no more than "Pending: attempt created, pods on their way" (its
    `Created` condition, and at most a `PodsHealthy` that says all is well). Such a status may wait a
    moment, like a detail: the job's pods are often Running a moment later, and then one status write
    (Running) and one event (AllNodesReady) replace two of each; a FineTuneJob status patch costs the API
    server about four times a ConfigMap create (decoding, validation and field management over the whole
    object). A first status that says anything else (waiting for admission, a pod problem, a failure) is
    news and is written at once."""
    if old.get("phase") or new.get("phase") != "Pending":
        return False
    conditions = [
        (c.get("type"), c.get("status"))
        for c in new.get("conditions") or []
        if (c.get("type"), c.get("status")) != ("PodsHealthy", "True")
    ]
    return conditions == [("Created", "True")]


STARTED_CONDITIONS = frozenset({("Created", "True"), ("PodsHealthy", "True"), ("Running", "True")})
"""The conditions of a first attempt that started and is well: created, its pods healthy, running."""


def only_started(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """A new job's first attempt starting with nothing wrong: nothing written yet, or no more than "Pending, pods
    starting" (`only_starting`), and now Pending or Running on attempt 1 with only `STARTED_CONDITIONS`. Such a
    write may wait for the end of a burst of new jobs (`runtime.Burst`): no child waits for it, and in a burst
    it competes with the other jobs' creates at the API server. Anything else (a pod problem, a failure, a
    restart, waiting for admission) is news."""
    if old.get("phase") and not only_starting({}, old):
        return False
    if new.get("phase") not in ("Pending", "Running") or new.get("attempt") != 1:
        return False
    return all((c.get("type"), c.get("status")) in STARTED_CONDITIONS for c in new.get("conditions") or [])
