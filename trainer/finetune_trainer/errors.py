"""Permanent trainer failures and the exit codes the operator reads from them.

A permanent error (bad config, missing dataset field, unknown model) must not burn the job's retries, so each
one maps to a distinct exit code from `finetune_api.constants`. Anything else (OOM, NCCL, a crashed
node, a failed push) escapes as an ordinary exception and is retryable. This module never decides *what* is
wrong; the loaders raise these with a message a person can act on.
"""

from finetune_api.constants import EXIT_BAD_DATASET, EXIT_INVALID_CONFIG, EXIT_UNKNOWN_MODEL


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


EXIT_SIGTERM = 143
"""128 + SIGTERM: a checkpoint was saved on SIGTERM; retryable, the next attempt resumes from it."""
