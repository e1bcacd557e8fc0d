"""The termination record, from the trainer's words to the job's status.

The container's exit code says whether a failure is permanent (the launcher makes the trainer's 64/65/66 the
container's own); the record in the termination message says what was wrong; the Job's FailJob condition
(reason PodFailurePolicy) says "permanent" when the pod itself is gone.
"""

import json

import pytest

from finetune_api.termination import TERMINATION_MESSAGE_LIMIT, TerminationRecord
from finetune_operator.handlers.indexes import summarize_pod
from finetune_operator.status import AttemptObserved, FailureCause, failure_cause

RECORD_65 = TerminationRecord(exit_code=65, reason="BadDatasetError", message="data.textField 'x' is not a column")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            json.dumps({"exitCode": 65, "reason": "BadDatasetError", "message": "data.textField 'x' is not a column"}),
            RECORD_65,
        ),
        (
            json.dumps({"exitCode": 65, "reason": "BadDatasetError", "message": "m", "host": "node-3"}),
            TerminationRecord(exit_code=65, reason="BadDatasetError", message="m"),
        ),
        ("Traceback (most recent call last): ...", None),
        (json.dumps({"exitCode": "65"}), None),
        ('{"exitCode": 65, "reason": "Bad', None),
        (None, None),
    ],
    ids=[
        "the trainer's JSON is read",
        "a field a newer trainer adds is ignored",
        "plain text is ignored",
        "a non-integer code is ignored",
        "a torn write is ignored",
        "no message",
    ],
)
def test_the_record_is_read_back(message: str | None, expected: TerminationRecord | None) -> None:
    assert TerminationRecord.from_message(message) == expected


def test_a_long_message_is_shortened_to_fit_and_stays_valid_json() -> None:
    record = TerminationRecord(exit_code=65, reason="BadDatasetError", message="é" * 5000)
    text = record.to_message()
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    parsed = TerminationRecord.from_message(text)
    assert parsed is not None and parsed.exit_code == 65 and parsed.message.startswith("éé")
    assert parsed.message.endswith("…") and len(parsed.message) < 5000


def failed_pod(exit_code: int, message: str | None, *, name: str = "job-1-0") -> dict[str, object]:
    terminated: dict[str, object] = {"exitCode": exit_code, "reason": "Error"}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {"name": name},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]},
    }


def cause_of(*pods: dict[str, object], failed_reason: str | None = None, failed_message: str | None = None) -> (
    FailureCause
):
    observed = tuple(summarize_pod(p) for p in pods)
    attempt = AttemptObserved(
        attempt=1, name="job-1", failed=True, failed_reason=failed_reason, failed_message=failed_message, pods=observed
    )
    return failure_cause(attempt)


NOT_RETRIED = "not retried: fix the spec or the data and re-create the job"


@pytest.mark.parametrize(
    ("pods", "failed_reason", "expected"),
    [
        (
            [failed_pod(65, RECORD_65.to_message())],
            "PodFailurePolicy",
            FailureCause(
                "PermanentError",
                "trainer in pod job-1-0 exited with permanent error code 65 "
                f"(BadDatasetError: data.textField 'x' is not a column); {NOT_RETRIED}",
                permanent=True,
            ),
        ),
        (
            [failed_pod(143, None, name="job-1-0"), failed_pod(66, None, name="job-1-1")],
            "PodFailurePolicy",
            FailureCause(
                "PermanentError",
                "trainer in pod job-1-1 exited with permanent error code 66 (model id or path does not exist); "
                f"{NOT_RETRIED}",
                permanent=True,
            ),
        ),
        (
            [],
            "PodFailurePolicy",
            FailureCause(
                "PermanentError",
                "Job job-1 failed on a permanent trainer exit code (Container trainer for pod ns/job-1-0 failed with "
                f"exit code 65 matching FailJob rule at index 0); {NOT_RETRIED}",
                permanent=True,
            ),
        ),
        (
            [failed_pod(1, RECORD_65.to_message())],
            "BackoffLimitExceeded",
            FailureCause(
                "PodFailed", "pod job-1-0 exited with code 1 (BadDatasetError: data.textField 'x' is not a column)"
            ),
        ),
        (
            [failed_pod(1, json.dumps({"exitCode": 1, "reason": "PushFailedError", "message": "push failed"}))],
            "BackoffLimitExceeded",
            FailureCause("PodFailed", "pod job-1-0 exited with code 1 (PushFailedError: push failed)"),
        ),
        (
            [failed_pod(1, None)],
            "BackoffLimitExceeded",
            FailureCause("PodFailed", "pod job-1-0 exited with code 1 (Error)"),
        ),
    ],
    ids=[
        "exit 65 with the trainer's record: permanent, in the trainer's words",
        "the permanent pod is the culprit, not the one stopped with SIGTERM; no record: the code's meaning",
        "the pod is gone: the Job's FailJob condition alone says permanent",
        "the container's code decides: a record saying 65 behind exit 1 is not permanent",
        "a retryable record is quoted",
        "a plain crash stays retryable",
    ],
)
def test_failure_cause(pods: list[dict[str, object]], failed_reason: str, expected: FailureCause) -> None:
    message = "Container trainer for pod ns/job-1-0 failed with exit code 65 matching FailJob rule at index 0"
    assert cause_of(*pods, failed_reason=failed_reason, failed_message=message) == expected
