"""compute_status: observed children + previous status → phase, attempt, conditions, transitions."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.status import FineTuneJobStatus
from finetune_operator.admit import admit
from finetune_operator.status import (
    AttemptObserved,
    Observed,
    PodObserved,
    StatusResult,
    compute_status,
    only_details_changed,
    only_starting,
)
from tests.builders import job_body

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
EARLIER = NOW - timedelta(minutes=10)



def status_of(job: FineTuneJob, observed: Observed, now: datetime) -> StatusResult:
    """`compute_status` with the job's admission under the default pod policy, as `reconcile` passes it."""
    return compute_status(job, observed, now, admit(job))


def ftj(
    *, status: dict[str, Any] | None = None, labels: dict[str, str] | None = None, **run_policy: Any
) -> FineTuneJob:
    body = job_body(name="demo", nodes=2, gpus=8, runPolicy={"backoffLimit": 2, **run_policy})
    body["metadata"].update(uid="u1", generation=3, labels=labels or {})
    job = FineTuneJob.from_body(body)
    return job.model_copy(update={"status": FineTuneJobStatus.model_validate(status or {})})


def pods(attempt: int, n: int = 2, **kw: Any) -> tuple[PodObserved, ...]:
    return tuple(PodObserved(name=f"demo-{attempt}-{i}", **kw) for i in range(n))


def attempt(n: int, **kw: Any) -> AttemptObserved:
    return AttemptObserved(attempt=n, name=f"demo-{n}", **kw)


RUNNING = pods(1, phase="Running", ready=True)
LOST = (PodObserved("demo-1-0", "Failed", exit_code=143, reason="DeletionByTaintManager", node="kwok-gpu-1"),)
PERMANENT = (PodObserved("demo-1-0", "Failed", exit_code=65, reason="Error"),)

CASES = [
    # (id, job kwargs, observed attempts, expected (phase, reason, attempt, restarts))
    ("a new job with no children is pending its first attempt", {}, {}, ("Pending", "Creating", 1, 0)),
    ("an attempt with pods still starting is pending", {}, {1: attempt(1, pods=pods(1))},
     ("Pending", "PodsStarting", 1, 0)),
    ("an attempt with every node ready is running", {}, {1: attempt(1, pods=RUNNING)},
     ("Running", "AllNodesReady", 1, 0)),
    ("a completed attempt succeeds", {}, {1: attempt(1, complete=True)}, ("Succeeded", "Completed", 1, 0)),
    ("a lost node on attempt 1 restarts as attempt 2", {}, {1: attempt(1, failed=True, pods=LOST)},
     ("Restarting", "NodeLost", 2, 1)),
    ("a failed pod with a retryable code restarts", {},
     {1: attempt(1, failed=True, pods=(PodObserved("demo-1-1", "Failed", exit_code=1),))},
     ("Restarting", "PodFailed", 2, 1)),
    ("a permanent exit code fails at once without a restart", {}, {1: attempt(1, failed=True, pods=PERMANENT)},
     ("Failed", "PermanentError", 1, 0)),
    ("a permanent exit code is read from the Job's pod-failure-policy condition", {},
     {1: attempt(1, failed=True, failed_reason="PodFailurePolicy",
                 failed_message="Container trainer for pod ns/demo-1-0 failed with exit code 66 matching FailJob")},
     ("Failed", "PermanentError", 1, 0)),
    ("the last allowed attempt failing exceeds the backoff limit", {"status": {"attempt": 3, "phase": "Running"}},
     {3: attempt(3, failed=True, pods=LOST)}, ("Failed", "BackoffLimitExceeded", 3, 2)),
    ("a new attempt starting after a restart stays restarting",
     {"status": {"attempt": 2, "phase": "Restarting", "message": "x"}}, {2: attempt(2, pods=pods(2))},
     ("Restarting", "Restarting", 2, 1)),
    ("the highest attempt on the cluster wins over a stale status", {"status": {"attempt": 1, "phase": "Running"}},
     {1: attempt(1, failed=True), 2: attempt(2, pods=pods(2, phase="Running", ready=True))},
     ("Running", "AllNodesReady", 2, 1)),
    ("runPolicy.suspend suspends a running job", {"suspend": True}, {1: attempt(1, pods=RUNNING)},
     ("Suspended", "Suspended", 1, 0)),
    ("a queued job waits for Kueue admission", {"labels": {"kueue.x-k8s.io/queue-name": "gpus"}},
     {1: attempt(1, suspended=True)}, ("Pending", "WaitingForAdmission", 1, 0)),
    ("a job past its deadline fails", {"activeDeadlineSeconds": 60, "status": {"startTime": "2026-01-01T11:50:00Z"}},
     {1: attempt(1, pods=RUNNING)}, ("Failed", "DeadlineExceeded", 1, 0)),
    ("a job within its deadline keeps running",
     {"activeDeadlineSeconds": 3600, "status": {"startTime": "2026-01-01T11:50:00Z"}},
     {1: attempt(1, pods=RUNNING)}, ("Running", "AllNodesReady", 1, 0)),
    ("an attempt whose pods are still terminating after a failure is not restarted yet", {},
     {1: attempt(1, failed_reason="BackoffLimitExceeded", failing_since=NOW - timedelta(seconds=30),
                 pods=RUNNING)}, ("Running", "AllNodesReady", 1, 0)),
    ("an attempt stuck terminating past the grace period is restarted (dead node)", {},
     {1: attempt(1, failed_reason="BackoffLimitExceeded", failing_since=NOW - timedelta(minutes=7))},
     ("Restarting", "AttemptFailed", 2, 1)),
    ("a permanent exit code is final while pods still terminate", {},
     {1: attempt(1, failing_since=NOW, pods=PERMANENT)}, ("Failed", "PermanentError", 1, 0)),
    ("a succeeded job stays succeeded whatever is observed", {"status": {"phase": "Succeeded", "attempt": 1}},
     {1: attempt(1, failed=True, pods=LOST)}, ("Succeeded", None, 1, 0)),
    ("a failed job never restarts", {"status": {"phase": "Failed", "attempt": 1}}, {},
     ("Failed", None, 1, 0)),
]


@pytest.mark.parametrize(("job_kwargs", "attempts", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_phase_reason_attempt(
    job_kwargs: dict[str, Any], attempts: dict[int, AttemptObserved], expected: tuple[Any, ...]
) -> None:
    result = status_of(ftj(**job_kwargs), Observed(attempts=attempts), NOW)
    status = result.status
    assert (status.phase, result.reason, status.attempt, status.restarts) == expected


def test_invalid_spec_fails_naming_the_field() -> None:
    body = job_body(name="demo", overrides={"zero_optimization": {"stage": 2}})
    result = status_of(FineTuneJob.from_body(body), Observed(), NOW)
    assert (result.status.phase, result.invalid, result.reason) == ("Failed", True, "InvalidSpec")
    assert result.status.conditions[-1].reason == "InvalidSpec"
    assert "spec.distributed.deepspeed.overrides.zero_optimization.stage" in (result.status.message or "")
    assert [t.reason for t in result.transitions] == ["InvalidSpec"]


def test_a_second_pass_over_the_same_state_changes_nothing() -> None:
    job = ftj()
    observed = Observed(attempts={1: attempt(1, pods=RUNNING)})
    first = status_of(job, observed, EARLIER)
    second = status_of(job.model_copy(update={"status": first.status}), observed, NOW)
    assert second.status == first.status
    assert second.transitions == []


def test_running_records_start_time_and_suspend_clears_it() -> None:
    running = status_of(ftj(), Observed(attempts={1: attempt(1, pods=RUNNING)}), EARLIER).status
    assert running.start_time == EARLIER
    suspended = status_of(
        ftj(status=running.to_dict(), suspend=True), Observed(attempts={1: attempt(1, suspended=True)}), NOW
    ).status
    assert (suspended.phase, suspended.start_time) == ("Suspended", None)
    suspended_cond = next(c for c in suspended.conditions if c.type == "Suspended")
    assert suspended_cond.status == "True"


def test_resume_flips_the_suspended_condition_to_false() -> None:
    prev = status_of(ftj(suspend=True), Observed(attempts={1: attempt(1, suspended=True)}), EARLIER).status
    resumed = status_of(ftj(status=prev.to_dict()), Observed(attempts={1: attempt(1, pods=RUNNING)}), NOW).status
    cond = next(c for c in resumed.conditions if c.type == "Suspended")
    assert (resumed.phase, cond.status, cond.reason, resumed.start_time) == ("Running", "False", "Resumed", NOW)


def test_restart_message_names_the_lost_pod_and_node() -> None:
    result = status_of(ftj(), Observed(attempts={1: attempt(1, failed=True, pods=LOST)}), NOW)
    assert result.transitions[0].type == "Warning"
    assert "demo-1-0" in result.transitions[0].message and "kwok-gpu-1" in result.transitions[0].message
    assert "attempt 2" in result.transitions[0].message


def test_permanent_error_message_explains_the_exit_code() -> None:
    status = status_of(ftj(), Observed(attempts={1: attempt(1, failed=True, pods=PERMANENT)}), NOW).status
    assert "65" in (status.message or "") and "dataset" in (status.message or "")
    assert status.completion_time == NOW


def test_plan_is_reported() -> None:
    status = status_of(ftj(), Observed(), NOW).status
    assert status.plan is not None and status.plan.zero_stage in (0, 1, 2, 3)
    assert status.observed_generation == 3 and status.nodes == 2


def test_the_culprit_is_named_not_the_pod_stopped_because_of_it() -> None:
    pods_ = (PodObserved("demo-1-0", "Failed", exit_code=143), PodObserved("demo-1-1", "Failed", exit_code=1))
    result = status_of(ftj(), Observed(attempts={1: attempt(1, failed=True, pods=pods_)}), NOW)
    assert "demo-1-1" in result.transitions[0].message and "demo-1-0" not in result.transitions[0].message


def _written(phase: str, ready: int, running: str = "False") -> dict[str, Any]:
    conditions = [{"type": "Created", "status": "True", "reason": "ChildrenCreated", "message": "attempt 1 created"}]
    if phase == "Running":
        conditions.append({"type": "Running", "status": running, "reason": "AllNodesReady", "message": f"{ready}/2"})
    return {"phase": phase, "attempt": 1, "readyNodes": ready, "message": f"{ready}/2 ready", "conditions": conditions}


@pytest.mark.parametrize(
    ("old", "new", "details"),
    [
        (_written("Pending", 0), _written("Pending", 1), True),  # one more node ready
        (_written("Running", 2, "True"), _written("Running", 1, "True"), True),  # a blip: messages only
        (_written("Pending", 1), _written("Running", 2, "True"), False),  # a phase change is news
        (_written("Pending", 1), {**_written("Pending", 1), "attempt": 2}, False),
        (_written("Pending", 1), {**_written("Pending", 1), "startTime": "2026-01-01T00:00:00Z"}, False),
        (_written("Running", 2, "True"), _written("Running", 2, "False"), False),  # a condition flips
        (_written("Pending", 1), _written("Pending", 1), False),  # nothing changed at all
    ],
)
def test_only_ready_counts_and_messages_are_details(old: dict[str, Any], new: dict[str, Any], details: bool) -> None:
    assert only_details_changed(old, new) is details


def _first(*conditions: tuple[str, str], phase: str = "Pending") -> dict[str, Any]:
    listed = [{"type": t, "status": v, "reason": t, "message": t} for t, v in conditions]
    message = "attempt 1: 0/2 node(s) ready"
    return {"phase": phase, "attempt": 1, "readyNodes": 0, "message": message, "conditions": listed}


@pytest.mark.parametrize(
    ("old", "new", "starting"),
    [
        ({}, _first(("Created", "True")), True),  # the attempt is created, its pods are on their way
        ({}, _first(("Created", "True"), ("PodsHealthy", "True")), True),  # and its first pod is fine
        ({}, _first(("Created", "True"), ("PodsHealthy", "False")), False),  # a pod problem is news
        ({}, _first(("Suspended", "True")), False),  # waiting for admission is news
        ({}, _first(("Created", "True"), ("Running", "True"), phase="Running"), False),
        ({}, _first(("Created", "True"), ("Failed", "True"), phase="Failed"), False),
        (_first(("Created", "True")), _first(("Created", "True")), False),  # not the first status
        (_written("Pending", 0), _written("Pending", 1), False),  # a detail, not a first status
    ],
)
def test_only_a_new_jobs_first_pending_status_is_starting(
    old: dict[str, Any], new: dict[str, Any], starting: bool
) -> None:
    assert only_starting(old, new) is starting
