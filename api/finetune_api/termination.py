"""The trainer's termination record: why a trainer process ended, in the one shape both sides use.

The trainer writes it, the operator reads it; the path between them is one channel:

1. A worker that fails knowingly (a permanent error, a push that failed after its retries) writes its record as
   JSON to the file named by `FTJOB_EXIT_FILE` before it exits (`finetune_trainer.__main__`).
2. The launcher around `accelerate launch` (`finetune_trainer.launch`, the pod's command) watches that file. A
   permanent record (exit code 64, 65 or 66) stops the whole worker group at once, so torch elastic does not
   restart it, and becomes the container's exit code, which the attempt Job's podFailurePolicy turns into a
   `FailJob`. When the container exits non-zero the launcher copies the record into the container's termination
   message (`/dev/termination-log`).
3. Kubernetes shows the message in the pod's status (`state.terminated.message`); the operator parses it back
   with `TerminationRecord.from_message` and quotes the trainer's reason and words in the job's status.

Pure: no I/O (the trainer writes the file, the launcher copies it, the operator reads the pod).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, StrictInt, ValidationError

from finetune_api import constants
from finetune_api.v1alpha1.base import ApiModel

TERMINATION_MESSAGE_LIMIT = 4096
"""Bytes of a container's termination message that Kubernetes keeps (the kubelet truncates the rest)."""

PERMANENT_MEANINGS: dict[int, str] = {
    constants.EXIT_INVALID_CONFIG: "trainer.json does not validate",
    constants.EXIT_BAD_DATASET: "bad dataset (missing text field, empty split or unreadable file)",
    constants.EXIT_UNKNOWN_MODEL: "model id or path does not exist",
}
"""What each permanent exit code means, for a status message when the trainer left no words of its own."""


class TerminationRecord(ApiModel):
    """Why a trainer process ended: `{"exitCode": 65, "reason": "BadDatasetError", "message": "..."}`."""

    # A newer trainer may add fields; an older operator must still read the record.
    model_config = ConfigDict(**{**ApiModel.model_config, "extra": "ignore"})

    exit_code: StrictInt = Field(description="The process's exit code; 64, 65 and 66 are permanent.")
    reason: str = Field(default="", description="What failed, in one word (the trainer's error class).")
    message: str = Field(default="", description="The trainer's own words, naming the field or file at fault.")

    @property
    def permanent(self) -> bool:
        """Retrying cannot fix it: the job fails at once, without a restart."""
        return self.exit_code in constants.EXIT_PERMANENT_CODES

    def to_message(self) -> str:
        """The record as JSON that fits a termination message (the message is shortened, the JSON stays whole)."""
        text = self.model_dump_json(by_alias=True)
        if len(text.encode()) <= TERMINATION_MESSAGE_LIMIT:
            return text

        def shortened(keep: int) -> str:
            return self.model_copy(update={"message": self.message[:keep] + "…"}).model_dump_json(by_alias=True)

        low, high = 0, len(self.message)  # the longest prefix that fits, escapes and multi-byte characters counted
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if len(shortened(mid).encode()) <= TERMINATION_MESSAGE_LIMIT else (low, mid - 1)
        return shortened(low)

    @classmethod
    def from_message(cls, text: str | None) -> TerminationRecord | None:
        """The record in a termination message or exit file; None for anything else (plain text, a torn write)."""
        if not text:
            return None
        try:
            return cls.model_validate_json(text)
        except ValidationError:
            return None
