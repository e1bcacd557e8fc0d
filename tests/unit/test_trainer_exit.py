"""A permanent trainer error survives `accelerate launch` (which exits 1) via the termination message."""

import json

import pytest

from finetune_operator.handlers.indexes import summarize_pod, trainer_exit
from finetune_operator.status import AttemptObserved, failure_cause


def failed_pod(exit_code: int, message: str | None) -> dict[str, object]:
    terminated: dict[str, object] = {"exitCode": exit_code, "reason": "Error"}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {"name": "job-1-0"},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]},
    }


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            json.dumps({"exitCode": 65, "reason": "BadDatasetError", "message": "no field 'text'"}),
            (65, "no field 'text'"),
        ),
        ("Traceback (most recent call last): ...", (None, None)),
        (json.dumps({"exitCode": "65"}), (None, None)),
        (None, (None, None)),
    ],
    ids=["the trainer's JSON is read", "plain text is ignored", "a non-integer code is ignored", "no message"],
)
def test_trainer_exit(message: str | None, expected: tuple[int | None, str | None]) -> None:
    assert trainer_exit(message) == expected


def test_accelerate_exit_1_with_a_permanent_trainer_code_fails_the_job_at_once() -> None:
    message = json.dumps({"exitCode": 65, "reason": "BadDatasetError", "message": "dataset has no field 'text'"})
    pod = summarize_pod(failed_pod(1, message))
    reason, text, code = failure_cause(AttemptObserved(attempt=1, name="job-1", failed=True, pods=(pod,)))
    assert (reason, code) == ("PermanentError", 65)
    assert "dataset has no field 'text'" in text and "not retried" in text


def test_a_plain_crash_stays_retryable() -> None:
    pod = summarize_pod(failed_pod(1, None))
    reason, _, code = failure_cause(AttemptObserved(attempt=1, name="job-1", failed=True, pods=(pod,)))
    assert (reason, code) == ("PodFailed", None)
