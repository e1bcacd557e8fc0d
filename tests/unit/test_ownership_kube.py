"""Kube's child calls, against scripted API answers (the real API server: tests/security): a create never writes
over an existing object (409 answers with the holder's metadata), the create's answer is kept undecoded, server-side
apply never forces another manager's field, and every delete or suspend names the object by uid."""

import asyncio
import json
from typing import Any

import pytest

from finetune_operator.handlers.kube import (
    FIELD_MANAGER,
    Created,
    Existing,
    FieldConflictError,
    Kube,
    RejectedError,
)
from finetune_operator.runtime import RetryLaterError


class Answer:
    """One scripted HTTP answer (what kubernetes_asyncio returns with `_preload_content=False`)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.reason, self.headers = status, "reason", {}
        self.data = json.dumps(body).encode()

    async def read(self) -> bytes:
        return self.data

    def release(self) -> None:
        pass


class FakeApi:
    """Any `<verb>_namespaced_<kind>` method: records (method, args, kwargs) and gives the next scripted answer."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers, self.calls = answers, []

    def __getattr__(self, method: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Answer:
            kwargs.pop("_preload_content")
            self.calls.append((method, args, kwargs))
            return self.answers.pop(0)

        return call


class ScriptedKube(Kube):
    def __init__(self, *answers: Answer) -> None:
        super().__init__(api=None)  # type: ignore[arg-type]
        self.fake = FakeApi(list(answers))

    @property
    def core(self) -> Any:
        return self.fake

    @property
    def batch(self) -> Any:
        return self.fake


def status(code: int, message: str = "", causes: list[dict[str, str]] | None = None) -> Answer:
    return Answer(code, {"kind": "Status", "code": code, "message": message, "details": {"causes": causes or []}})


CM = {"kind": "ConfigMap", "metadata": {"name": "web-config", "namespace": "ns"}, "data": {"a": "b"}}
OURS = {**CM, "metadata": {**CM["metadata"], "uid": "u-cm"}}


def test_a_created_child_keeps_its_answer_undecoded_until_its_uid_is_asked_for() -> None:
    kube = ScriptedKube(Answer(201, {"metadata": {"name": "web-config", "uid": "u-new"}}))
    created = asyncio.run(kube.create(CM))
    assert isinstance(created, Created) and isinstance(created.answer, bytes)
    assert (created.kind, created.namespace, created.name, created.uid) == ("ConfigMap", "ns", "web-config", "u-new")
    assert kube.fake.calls == [("create_namespaced_config_map", ("ns", CM), {"field_manager": FIELD_MANAGER})]


def test_a_taken_name_answers_with_the_holders_metadata_and_writes_nothing() -> None:
    holder = {"name": "web-config", "uid": "u-theirs", "labels": {"app": "web"}}
    kube = ScriptedKube(status(409, "already exists"), Answer(200, {"metadata": holder, "data": {"x": "y"}}))
    existing = asyncio.run(kube.create(CM))
    assert existing == Existing("ConfigMap", "web-config", holder)
    assert [method for method, _, _ in kube.fake.calls] == [
        "create_namespaced_config_map",
        "read_namespaced_config_map",
    ]


def test_a_holder_gone_before_it_could_be_read_is_a_retry() -> None:
    kube = ScriptedKube(status(409, "already exists"), status(404))
    with pytest.raises(RetryLaterError):
        asyncio.run(kube.create(CM))


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (422, RejectedError),
        (400, RejectedError),
        (403, RejectedError),
        (503, RetryLaterError),
        (429, RetryLaterError),
    ],
)
def test_create_errors(code: int, error: type[Exception]) -> None:
    with pytest.raises(error):
        asyncio.run(ScriptedKube(status(code, "tolerations: Unsupported value")).create(CM))


def test_a_job_create_goes_to_the_batch_api() -> None:
    job = {"kind": "Job", "metadata": {"name": "web-1", "namespace": "ns"}}
    kube = ScriptedKube(Answer(201, {"metadata": {"uid": "u-j"}}))
    assert isinstance(asyncio.run(kube.create(job)), Created)
    assert kube.fake.calls[0][0] == "create_namespaced_job"


def test_apply_is_unforced_and_names_the_object_by_uid() -> None:
    kube = ScriptedKube(Answer(200, {}))
    asyncio.run(kube.apply(OURS))
    ((method, args, kwargs),) = kube.fake.calls
    assert method == "patch_namespaced_config_map" and args == ("web-config", "ns", OURS)
    assert kwargs["force"] is False and kwargs["field_manager"] == FIELD_MANAGER
    assert args[2]["metadata"]["uid"] == "u-cm"


def test_apply_refuses_a_child_without_its_uid() -> None:
    with pytest.raises(ValueError, match="only an existing child"):
        asyncio.run(ScriptedKube().apply(CM))


def test_a_field_held_by_another_manager_is_never_forced() -> None:
    causes = [{"type": "FieldManagerConflict", "message": 'conflict with "kubectl-edit" using v1', "field": ".data.a"}]
    kube = ScriptedKube(
        status(409, 'Apply failed with 1 conflict: conflict with "kubectl-edit" using v1: .data.a', causes)
    )
    with pytest.raises(FieldConflictError, match="kubectl-edit"):
        asyncio.run(kube.apply(OURS))
    assert len(kube.fake.calls) == 1


def test_a_conflict_with_our_own_create_alone_is_applied_again_with_force() -> None:
    causes = [
        {"type": "FieldManagerConflict", "message": f'conflict with "{FIELD_MANAGER}" using v1', "field": ".data.a"}
    ]
    kube = ScriptedKube(status(409, "Apply failed with 1 conflict", causes), Answer(200, {}))
    asyncio.run(kube.apply(OURS))
    assert [kwargs["force"] for _, _, kwargs in kube.fake.calls] == [False, True]


def test_a_conflict_with_ours_and_another_manager_is_not_forced() -> None:
    causes = [{"message": f'conflict with "{FIELD_MANAGER}" using v1'}, {"message": 'conflict with "helm"'}]
    kube = ScriptedKube(status(409, "Apply failed with 2 conflicts", causes))
    with pytest.raises(FieldConflictError):
        asyncio.run(kube.apply(OURS))


def test_delete_carries_the_uid_precondition_and_leaves_a_replaced_object_alone() -> None:
    kube = ScriptedKube(Answer(200, {}), status(409, "Precondition failed: UID in precondition"), status(404))
    for _ in range(3):
        asyncio.run(kube.delete("Service", "ns", "web", "u-svc"))
    assert [(m, a, k["body"]) for m, a, k in kube.fake.calls] == [
        (
            "delete_namespaced_service",
            ("web", "ns"),
            {"preconditions": {"uid": "u-svc"}, "propagationPolicy": "Background"},
        )
    ] * 3


def test_suspend_names_the_job_by_uid() -> None:
    kube = ScriptedKube(Answer(200, {}))
    asyncio.run(kube.suspend_job("ns", "web-1", "u-j", True))
    ((method, args, _),) = kube.fake.calls
    assert (method, args) == (
        "patch_namespaced_job",
        ("web-1", "ns", {"metadata": {"uid": "u-j"}, "spec": {"suspend": True}}),
    )


def test_apply_to_a_name_another_object_took_meanwhile_is_a_retry_not_a_rejected_spec() -> None:
    immutable = status(
        422,
        'ConfigMap "web-config" is invalid: metadata.uid: Invalid value: "u-cm": field is immutable',
        [{"reason": "FieldValueInvalid", "field": "metadata.uid"}],
    )
    with pytest.raises(RetryLaterError):
        asyncio.run(ScriptedKube(immutable).apply(OURS))
    gone = status(409, "uid mismatch: the provided object specified uid u-cm, and no existing object was found")
    with pytest.raises(RetryLaterError):
        asyncio.run(ScriptedKube(gone).apply(OURS))
    with pytest.raises(RejectedError):  # any other invalid field is the spec's
        asyncio.run(ScriptedKube(status(422, "data: Too long", [{"field": "data"}])).apply(OURS))
