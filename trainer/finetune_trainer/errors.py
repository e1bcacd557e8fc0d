"""Permanent trainer failures, their exit codes, and the termination record a failing worker leaves.

A permanent error (bad config, missing dataset field, unknown model) must not burn the job's retries, so each
one maps to a distinct exit code from `finetune_api.constants`. Anything else (OOM, NCCL, a crashed
node, a failed push) escapes as an ordinary exception and is retryable. This module never decides *what* is
wrong; the loaders raise these with a message a person can act on.

`report()` writes a failure's `TerminationRecord` to the file the launcher watches (`FTJOB_EXIT_FILE`, set by
`finetune_trainer.launch`): that file is the only way the code survives `accelerate launch`, which exits 1 for
any worker failure. `inject_test_fault()` is the test hook that makes a run fail on purpose after the model is
loaded (`FTJOB_TEST_FAULT`), so tests can count model loads across elastic restarts.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from finetune_api import constants
from finetune_api.constants import EXIT_BAD_DATASET, EXIT_INVALID_CONFIG, EXIT_UNKNOWN_MODEL
from finetune_api.termination import TerminationRecord

EXIT_SIGTERM = constants.EXIT_SIGTERM


class PermanentError(Exception):
    """A failure that retrying cannot fix; `exit_code` tells the operator to fail the job at once."""

    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidConfigError(PermanentError):
    """trainer.json does not validate."""

    exit_code = EXIT_INVALID_CONFIG


class BadDatasetError(PermanentError):
    """The dataset is missing, unreadable, empty, or lacks the text field."""

    exit_code = EXIT_BAD_DATASET


class UnknownModelError(PermanentError):
    """The model id or path does not exist (or is not a causal LM)."""

    exit_code = EXIT_UNKNOWN_MODEL


class PushFailedError(Exception):
    """The adapter could not be pushed after all retries; retryable, so not a PermanentError."""


PERMANENT_ERRORS: dict[int, type[PermanentError]] = {
    cls.exit_code: cls for cls in (InvalidConfigError, BadDatasetError, UnknownModelError)
}


def report(record: TerminationRecord) -> None:
    """Leave the record for the launcher (atomically: it polls the file); nothing to do without a launcher."""
    exit_file = os.environ.get(constants.ENV_EXIT_FILE)
    if not exit_file:
        return
    tmp = Path(f"{exit_file}.{os.getpid()}")
    with contextlib.suppress(OSError):
        tmp.write_text(record.model_dump_json(by_alias=True))
        os.replace(tmp, exit_file)


def inject_test_fault() -> None:
    """The test hook (`constants.ENV_TEST_FAULT`): `exit:CODE` raises that permanent error; `crash-once:PATH`
    SIGKILLs the first worker that creates PATH, as a node's OOM killer would."""
    fault = os.environ.get(constants.ENV_TEST_FAULT, "")
    kind, _, arg = fault.partition(":")
    if kind == "exit":
        raise PERMANENT_ERRORS[int(arg)](f"{constants.ENV_TEST_FAULT}={fault}: failing on purpose after the load")
    if kind == "crash-once":
        try:
            os.close(os.open(arg, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)
