"""The pods' problems on the FineTuneJob: the `PodsHealthy` condition, `status.message`, the failure causes, and
the pod index entry that carries a problem (the summary, not the pod) to `compute_status`."""

from datetime import UTC, datetime
from typing import Any

from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.status import FineTuneJobStatus
from finetune_operator.admit import admit
from finetune_operator.handlers.indexes import summarize_pod
from finetune_operator.health import PodProblem
from finetune_operator.status import (
    AttemptObserved,
    Observed,
    PodObserved,
    StatusResult,
    compute_status,
    failure_cause,
    only_details_changed,
)
from tests.builders import job_body
from tests.unit.test_health import EVICTED, EVICTION_MESSAGE, GPU_MESSAGE, PVC_MESSAGE, terminated, unschedulable

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
STUCK = PodProblem("Unschedulable", GPU_MESSAGE)
OOM = PodProblem("OOMKilled", "container trainer was killed for using more than its memory limit of 64Gi")



def status_of(job: FineTuneJob, observed: Observed, now: datetime) -> StatusResult:
    """`compute_status` with the job's admission under the default pod policy, as `reconcile` passes it."""
    return compute_status(job, observed, now, admit(job))


def ftj(status: dict[str, Any] | None = None, **run_policy: Any) -> FineTuneJob:
    body = job_body(name="demo", nodes=2, gpus=8, runPolicy={"backoffLimit": 2, **run_policy})
    body["metadata"].update(uid="u1", generation=1)
    job = FineTuneJob.from_body(body)
    return job.model_copy(update={"status": FineTuneJobStatus.model_validate(status or {})})


def observed(*pods: PodObserved, **attempt: Any) -> Observed:
    return Observed(attempts={1: AttemptObserved(1, "demo-1", pods=pods, **attempt)})


def condition(status: FineTuneJobStatus, ctype: str = "PodsHealthy") -> tuple[str, str, str] | None:
    found = next((c for c in status.conditions if c.type == ctype), None)
    return (found.status, found.reason, found.message) if found else None


def test_unschedulable_pods_show_on_the_job_with_the_schedulers_message() -> None:
    pods = (PodObserved("demo-1-0", problem=STUCK), PodObserved("demo-1-1", problem=STUCK))
    status = status_of(ftj(), observed(*pods), NOW).status
    assert status.phase == "Pending"
    message = f"pods demo-1-0, demo-1-1: Unschedulable: {GPU_MESSAGE}"
    assert condition(status) == ("False", "Unschedulable", message)
    assert status.message == f"attempt 1: 0/2 node(s) ready; {message}"


def test_the_condition_clears_when_the_problem_goes_and_keeps_its_transition_time_otherwise() -> None:
    stuck = status_of(ftj(), observed(PodObserved("demo-1-0", problem=STUCK)), NOW).status
    later = NOW.replace(minute=5)
    again = status_of(ftj(stuck.to_dict()), observed(PodObserved("demo-1-0", problem=STUCK)), later).status
    assert next(c for c in again.conditions if c.type == "PodsHealthy").last_transition_time == NOW
    running = (PodObserved("demo-1-0", "Running", ready=True), PodObserved("demo-1-1", "Running", ready=True))
    healed = status_of(ftj(again.to_dict()), observed(*running), later).status
    assert condition(healed) == ("True", "PodsHealthy", "no pod of the current attempt shows a problem")
    assert next(c for c in healed.conditions if c.type == "PodsHealthy").last_transition_time == later
    assert healed.phase == "Running" and healed.message == "attempt 1: 2/2 node(s) running"


def test_no_condition_before_the_first_pod() -> None:
    assert condition(status_of(ftj(), observed(), NOW).status) is None
    assert condition(status_of(ftj(), Observed(), NOW).status) is None


def test_a_message_only_change_is_a_detail_and_a_new_problem_is_news() -> None:
    stuck = status_of(ftj(), observed(PodObserved("demo-1-0", problem=STUCK)), NOW).status.to_dict()
    other = PodProblem("Unschedulable", PVC_MESSAGE)
    moved = status_of(ftj(stuck), observed(PodObserved("demo-1-0", problem=other)), NOW).status.to_dict()
    assert moved != stuck and only_details_changed(stuck, moved)  # written within the batching second
    pulling = PodProblem("ErrImagePull", 'container trainer, image "x": failed')
    pull = status_of(ftj(stuck), observed(PodObserved("demo-1-0", problem=pulling)), NOW).status.to_dict()
    assert not only_details_changed(stuck, pull)  # another reason: written at once


def test_an_oom_kill_that_fails_the_job_names_the_container_and_its_limit() -> None:
    pod = PodObserved("demo-1-0", "Failed", exit_code=137, reason="OOMKilled", problem=OOM)
    result = status_of(ftj(backoffLimit=0), observed(pod, failed=True), NOW)
    status = result.status
    assert status.phase == "Failed"
    failed = condition(status, "Failed")
    assert failed is not None and failed[:2] == ("True", "BackoffLimitExceeded")
    assert status.message is not None and f"pod demo-1-0 exited with code 137 ({OOM.text})" in status.message
    assert status.message.count("OOMKilled") == 1  # the cause says it once; the condition has it too
    assert condition(status) == ("False", "OOMKilled", f"pod demo-1-0: {OOM.text}")


def test_while_restarting_the_failed_attempts_problem_stays_in_view() -> None:
    pod = PodObserved("demo-1-0", "Failed", exit_code=137, reason="OOMKilled", problem=OOM)
    status = status_of(ftj(), observed(pod, failed=True), NOW).status
    assert (status.phase, status.attempt) == ("Restarting", 2)
    assert condition(status) == ("False", "OOMKilled", f"pod demo-1-0: {OOM.text}")
    assert status.message == (
        f"attempt 1 failed: pod demo-1-0 exited with code 137 ({OOM.text}); starting attempt 2 (restart 1 of 2)"
    )


def test_an_eviction_is_explained_with_the_kubelets_message() -> None:
    pod = summarize_pod(EVICTED)
    cause = failure_cause(AttemptObserved(1, "demo-1", failed=True, pods=(pod,)))
    assert cause.reason == "NodeLost"
    assert cause.message == f"pod demo-1-0 on node ftjob-node was lost (Evicted: {EVICTION_MESSAGE.strip()})"


def test_the_pod_index_keeps_the_problem_not_the_pod() -> None:
    assert summarize_pod(unschedulable(PVC_MESSAGE)).problem == PodProblem("Unschedulable", PVC_MESSAGE)
    oom = summarize_pod(terminated("OOMKilled", 137, memory="64Gi"))
    assert (oom.phase, oom.exit_code, oom.reason, oom.problem) == ("Failed", 137, "OOMKilled", OOM)
    assert summarize_pod(terminated("Completed", 0, phase="Succeeded")).problem is None
