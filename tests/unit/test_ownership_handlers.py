"""The round's side of child ownership, with a recording stand-in for `Kube` (the real API server:
tests/security/test_collisions.py): what a taken name leads to, and that a rollback deletes exactly what the round
created, by uid."""

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from finetune_operator.handlers.kube import Created, Existing, FieldConflictError
from finetune_operator.handlers.reconciling import ChildConflictError, _apply, _undo
from finetune_operator.reconcile import Actions, reconcile
from finetune_operator.render import RenderOptions
from finetune_operator.runtime import Burst, ChildTriggers, RetryLaterError
from finetune_operator.status import AttemptObserved, Observed
from tests.unit.test_ownership import NOW, ftj, ref

JOB = ftj()


class RecordingKube:
    """Creates succeed unless `taken` names the holder's metadata for that name; every call is recorded."""

    def __init__(self, taken: dict[str, dict[str, Any]] | None = None, conflict: bool = False) -> None:
        self.taken, self.conflict, self.calls = taken or {}, conflict, []

    async def create(self, obj: dict[str, Any]) -> Created | Existing:
        name = obj["metadata"]["name"]
        self.calls.append(("create", name))
        if name in self.taken:
            return Existing(obj["kind"], name, self.taken[name])
        answer = {**obj, "metadata": {**obj["metadata"], "uid": f"u-{name}"}}  # the object as created
        return Created(obj["kind"], obj["metadata"]["namespace"], name, json.dumps(answer).encode())

    async def apply(self, obj: dict[str, Any]) -> None:
        self.calls.append(("apply", obj["metadata"]["name"], obj["metadata"]["uid"]))
        if self.conflict:
            raise FieldConflictError(obj["kind"], obj["metadata"]["name"], 'conflict with "kubectl-edit": .data.x')

    async def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete", name, uid))

    async def suspend_job(self, namespace: str, name: str, uid: str, suspend: bool) -> None:
        self.calls.append(("suspend", name, uid))


def new_job_actions() -> Actions:
    return reconcile(JOB, Observed(), NOW, RenderOptions(image="trainer:test"))


def run(kube: RecordingKube, actions: Actions) -> list[Created]:
    """A round's apply that succeeds: what it created."""
    created: list[Created] = []
    asyncio.run(_apply(SimpleNamespace(kube=kube, children=ChildTriggers(), burst=Burst()), JOB, actions, created))
    return created


def apply_and_roll_back(kube: RecordingKube, actions: Actions) -> Exception:
    """What `_reconcile_once` does: apply, and on a conflict undo what was created."""
    created: list[Created] = []
    state = SimpleNamespace(kube=kube, children=ChildTriggers(), burst=Burst())
    with pytest.raises((ChildConflictError, RetryLaterError)) as raised:
        asyncio.run(_apply(state, JOB, actions, created))
    if isinstance(raised.value, ChildConflictError):
        asyncio.run(_undo(state, created))
    return raised.value


def test_the_common_path_is_one_create_per_child_and_nothing_else() -> None:
    kube = RecordingKube()
    created = run(kube, new_job_actions())
    assert sorted(kube.calls) == [("create", "web"), ("create", "web-1"), ("create", "web-config")]
    assert [c.name for c in created][-1] == "web-1"


def test_a_foreign_configmap_fails_the_job_and_only_what_this_round_created_is_deleted() -> None:
    kube = RecordingKube(taken={"web-config": {"name": "web-config", "uid": "u-theirs"}})
    error = apply_and_roll_back(kube, new_job_actions())
    assert isinstance(error, ChildConflictError) and error.reason == "NameConflict"
    assert "ConfigMap web-config" in str(error) and "it has no controlling owner" in str(error)
    # The Service was created in the same round: taken back by its own uid. The ConfigMap: never written.
    assert [c for c in kube.calls if c[0] != "create"] == [("delete", "web", "u-web")]
    assert ("create", "web-1") not in kube.calls  # no Job without its ConfigMap


def test_a_foreign_job_under_the_attempts_name_is_never_adopted_nor_deleted() -> None:
    theirs = {
        "name": "web-1",
        "uid": "u-theirs",
        "ownerReferences": [ref("u-cron", kind="CronJob", name="web", api="batch/v1")],
    }
    kube = RecordingKube(taken={"web-1": theirs})
    error = apply_and_roll_back(kube, new_job_actions())
    assert isinstance(error, ChildConflictError) and "Job web-1" in str(error) and "CronJob web" in str(error)
    assert sorted(c for c in kube.calls if c[0] == "delete") == [
        ("delete", "web", "u-web"),
        ("delete", "web-config", "u-web-config"),
    ]
    assert not [c for c in kube.calls if c[0] in ("apply", "suspend")]


def test_a_deleted_namesakes_leftover_is_waited_for_not_touched() -> None:
    leftover = {"name": "web-config", "uid": "u-left", "ownerReferences": [ref("u-old")]}
    kube = RecordingKube(taken={"web-config": leftover})
    error = apply_and_roll_back(kube, new_job_actions())
    assert isinstance(error, RetryLaterError) and error.delay == 1.0
    assert [c for c in kube.calls if c[0] != "create"] == []  # what was created is ours: the next round reuses it


def test_a_conflict_wins_over_a_wait_so_the_job_fails_at_once() -> None:
    kube = RecordingKube(
        taken={
            "web-config": {"name": "web-config", "uid": "u-left", "ownerReferences": [ref("u-old")]},
            "web": {"name": "web", "uid": "u-theirs"},
        }
    )
    assert isinstance(apply_and_roll_back(kube, new_job_actions()), ChildConflictError)


def test_a_child_that_is_ours_but_not_yet_seen_is_updated_by_its_uid() -> None:
    ours = {"name": "web-config", "uid": "u-cm", "ownerReferences": [ref("u-web")]}
    ours_job = {"name": "web-1", "uid": "u-j", "ownerReferences": [ref("u-web")]}
    kube = RecordingKube(taken={"web-config": ours, "web-1": ours_job})
    created = run(kube, new_job_actions())
    assert ("apply", "web-config", "u-cm") in kube.calls
    assert [c.name for c in created] == ["web"]  # the Job of ours is the attempt itself: neither created nor updated
    assert not [c for c in kube.calls if c[0] in ("delete", "suspend") or c[:2] == ("apply", "web-1")]


def test_a_field_another_manager_holds_fails_the_job_as_a_field_conflict() -> None:
    kube = RecordingKube(conflict=True)
    observed = Observed(
        config_map={"old": "x"},
        config_map_uid="u-cm",
        service=True,
        attempts={1: AttemptObserved(1, "web-1", uid="u-j")},
    )
    actions = reconcile(ftj(status={"phase": "Pending", "attempt": 1}), observed, NOW, RenderOptions(image="t"))
    error = apply_and_roll_back(kube, actions)
    assert isinstance(error, ChildConflictError) and error.reason == "FieldConflict" and "kubectl-edit" in str(error)
    assert kube.calls == [("apply", "web-config", "u-cm")]


def test_old_attempts_are_deleted_and_suspended_by_uid() -> None:
    actions = Actions(
        status=JOB.status,
        transitions=[],
        delete_jobs=["web-1"],
        suspend_jobs={"web-2": True},
        job_uids={"web-1": "u-j1", "web-2": "u-j2"},
    )
    kube = RecordingKube()
    run(kube, actions)
    assert kube.calls == [("delete", "web-1", "u-j1"), ("suspend", "web-2", "u-j2")]
