"""The pure half of child ownership: whose an object under a child's name is (`claim`), what the job's status
becomes when it is not this job's (`child_conflict`), and that every write the actions ask for names an object
this job owns by uid (the ConfigMap update, the Jobs to delete or suspend)."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from finetune_api import constants
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.status import FineTuneJobStatus
from finetune_operator.admit import admit
from finetune_operator.reconcile import claim, holder, namesake_wait, reconcile
from finetune_operator.render import RenderOptions, render_all
from finetune_operator.status import (
    AttemptObserved,
    Observed,
    StatusResult,
    child_conflict,
    compute_status,
    field_conflict_message,
    name_conflict_message,
)
from tests.builders import job_body

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
OPTIONS = RenderOptions(image="trainer:test")



def status_of(job: FineTuneJob, observed: Observed, now: datetime) -> StatusResult:
    """`compute_status` with the job's admission under the default pod policy, as `reconcile` passes it."""
    return compute_status(job, observed, now, admit(job))


def ftj(status: dict[str, Any] | None = None, **run_policy: Any) -> FineTuneJob:
    body = job_body(name="web", nodes=1, gpus=8, runPolicy={"backoffLimit": 2, **run_policy})
    body["metadata"].update(uid="u-web", generation=2)
    job = FineTuneJob.from_body(body)
    return job.model_copy(update={"status": FineTuneJobStatus.model_validate(status or {})})


def ref(
    uid: str,
    *,
    kind: str = "FineTuneJob",
    name: str = "web",
    api: str = "finetune.dev/v1alpha1",
    controller: bool = True,
) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": controller}


def meta(*refs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": "web", "uid": "u-object", "ownerReferences": list(refs), **extra}


CLAIMS = [
    ("controlled by this job's uid is ours", meta(ref("u-web")), "ours"),
    (
        "controlled by a FineTuneJob of this name with another uid is a deleted namesake's",
        meta(ref("u-old")),
        "namesake",
    ),
    ("no owner at all is foreign", meta(), "foreign"),
    (
        "an owner reference to this job that is not the controller is not ours",
        meta(ref("u-web", controller=False)),
        "foreign",
    ),
    ("a Deployment's Service is foreign", meta(ref("u-d", kind="Deployment", api="apps/v1")), "foreign"),
    ("another FineTuneJob's child is foreign", meta(ref("u-other", name="db")), "foreign"),
    (
        "a FineTuneJob of another API version is not taken for a namesake",
        meta(ref("u-old", api="finetune.dev/v9")),
        "foreign",
    ),
]


@pytest.mark.parametrize(("case", "found", "expected"), CLAIMS, ids=[c[0] for c in CLAIMS])
def test_claim(case: str, found: dict[str, Any], expected: str) -> None:
    assert claim(found, ftj()) == expected


def test_a_job_without_a_uid_owns_nothing() -> None:
    job = ftj()
    job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"uid": None})})
    assert claim(meta(ref("")), job) != "ours"


def test_holder_names_the_controller_or_says_there_is_none() -> None:
    assert (
        holder(meta(ref("u-d", kind="Deployment", name="web-frontend")))
        == "it is controlled by Deployment web-frontend"
    )
    assert holder(meta()) == "it has no controlling owner"


def test_a_namesake_leftover_is_looked_at_again_soon_then_less_often_while_a_finalizer_holds_it() -> None:
    assert namesake_wait(meta(), NOW) == 1.0  # the garbage collector has yet to delete it
    deleted = lambda ago: meta(deletionTimestamp=(NOW - ago).isoformat().replace("+00:00", "Z"))  # noqa: E731
    assert namesake_wait(deleted(timedelta(seconds=2)), NOW) == 1.0
    assert namesake_wait(deleted(timedelta(seconds=100)), NOW) == 10.0
    assert namesake_wait(deleted(timedelta(hours=1)), NOW) == 30.0


def test_conflict_messages_name_the_object_and_what_to_do() -> None:
    text = name_conflict_message("Service", "web", "it has no controlling owner")
    assert "Service web" in text and "not this job's" in text and "another name" in text
    text = field_conflict_message("ConfigMap", "web-config", 'conflict with "kubectl-edit": .data.trainer.json')
    assert "ConfigMap web-config" in text and "kubectl-edit" in text and "does not overwrite" in text


def test_a_name_conflict_fails_the_job_for_good() -> None:
    message = name_conflict_message("ConfigMap", "web-config", "it has no controlling owner")
    result = child_conflict(ftj(), 1, "NameConflict", message, NOW)
    st = result.status
    assert (st.phase, st.attempt, st.message, st.completion_time, st.observed_generation) == (
        "Failed",
        1,
        message,
        NOW,
        2,
    )
    (failed,) = [c for c in st.conditions if c.type == "Failed"]
    assert (failed.status, failed.reason, failed.message) == ("True", "NameConflict", message)
    assert [(t.type, t.reason) for t in result.transitions] == [("Warning", "NameConflict")]
    # Sticky: the next rounds keep it, create nothing and post nothing.
    failed_job = ftj(status=st.to_dict(exclude_none=True))
    later = status_of(failed_job, Observed(), NOW + timedelta(minutes=5))
    assert later.status.phase == "Failed" and later.transitions == []
    actions = reconcile(failed_job, Observed(), NOW + timedelta(minutes=5), OPTIONS)
    assert (actions.apply, actions.create, actions.delete_jobs) == ([], [], [])


def test_a_conflict_on_a_later_attempt_keeps_the_earlier_conditions() -> None:
    running = ftj(
        status={
            "phase": "Restarting",
            "attempt": 2,
            "conditions": [{"type": "Restarting", "status": "True", "reason": "NodeLost", "message": "x"}],
        }
    )
    st = child_conflict(running, 2, "NameConflict", "m", NOW).status
    assert st.attempt == 2 and {c.type: c.reason for c in st.conditions} == {
        "Restarting": "NameConflict",
        "Failed": "NameConflict",
    }
    assert {c.type: c.status for c in st.conditions} == {"Restarting": "False", "Failed": "True"}


def test_a_new_job_creates_its_children_and_names_none_by_uid() -> None:
    actions = reconcile(ftj(), Observed(), NOW, OPTIONS)
    assert [o["kind"] for o in actions.apply] == ["ConfigMap", "Service"]
    assert all("uid" not in o["metadata"] for o in [*actions.apply, *actions.create])
    assert actions.job_uids == {}


def test_an_observed_configmap_is_updated_by_its_uid() -> None:
    observed = Observed(
        config_map={"old": "data"},
        config_map_uid="u-cm",
        service=True,
        attempts={1: AttemptObserved(1, "web-1", uid="u-job1")},
    )
    (update,) = reconcile(ftj(status={"phase": "Pending", "attempt": 1}), observed, NOW, OPTIONS).apply
    assert update["kind"] == "ConfigMap" and update["metadata"]["uid"] == "u-cm"
    assert update["data"] == render_all(ftj(), OPTIONS).config_map["data"]
    assert update["metadata"]["ownerReferences"][0]["uid"] == "u-web"


def test_jobs_to_delete_or_suspend_come_with_their_uids() -> None:
    restarted = ftj(status={"phase": "Restarting", "attempt": 2})
    observed = Observed(
        config_map=render_all(restarted, OPTIONS).config_map["data"],
        service=True,
        attempts={
            1: AttemptObserved(1, "web-1", failed=True, uid="u-job1"),
            2: AttemptObserved(2, "web-2", uid="u-job2"),
        },
    )
    actions = reconcile(restarted, observed, NOW, OPTIONS)
    assert actions.delete_jobs == ["web-1"]
    assert {name: actions.job_uids[name] for name in actions.delete_jobs} == {"web-1": "u-job1"}
    suspended = ftj(status={"phase": "Running", "attempt": 2}, suspend=True)
    actions = reconcile(suspended, observed, NOW, OPTIONS)
    assert actions.suspend_jobs == {"web-2": True} and actions.job_uids["web-2"] == "u-job2"


def test_every_child_the_operator_creates_carries_the_managed_by_label_the_admission_policy_asks_for() -> None:
    rendered = render_all(ftj(), OPTIONS)
    for child in rendered.manifests:
        assert child["metadata"]["labels"][constants.LABEL_MANAGED_BY] == constants.MANAGED_BY, child["kind"]
    assert rendered.job["spec"]["template"]["metadata"]["labels"][constants.LABEL_MANAGED_BY] == constants.MANAGED_BY
