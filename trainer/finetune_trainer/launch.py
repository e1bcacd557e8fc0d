"""`python -m finetune_trainer.launch <accelerate launch args>`: keep the trainer's permanent exit codes.

`accelerate launch` turns every worker failure into exit 1 (the single-process launcher raises
`CalledProcessError`, torchrun raises `ChildFailedError`), so a pod running it directly can never exit 64/65/66
and the operator would burn retries on a missing dataset field. This wrapper runs the same command with
`FTJOB_EXIT_FILE` set; a worker that fails permanently writes `{"exitCode", "reason", "message"}` there
(`__main__._report_permanent`), and the wrapper exits with that code instead of accelerate's. Everything else
(0, retryable failures, signals) passes through unchanged. SIGTERM/SIGINT are forwarded once to the launcher,
which runs in its own session so an init's group-wide signal does not reach it twice.

Usage (what the operator can put in front of its command):

    python -m finetune_trainer.launch --config_file /etc/ftjob/accelerate.yaml ... -m finetune_trainer --config ...
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

from finetune_api import constants
from finetune_api.constants import EXIT_PERMANENT_CODES

ENV_EXIT_FILE = constants.ENV_EXIT_FILE


def permanent_code(exit_file: Path) -> int | None:
    """The permanent exit code a worker recorded, if any."""
    try:
        code = json.loads(exit_file.read_text()).get("exitCode")
    except (OSError, ValueError, AttributeError):
        return None
    return code if code in EXIT_PERMANENT_CODES else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="ftjob-exit-") as tmp:
        exit_file = Path(os.environ.get(ENV_EXIT_FILE) or Path(tmp) / "exit.json")
        exit_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "accelerate.commands.launch", *args]
        child = subprocess.Popen(cmd, env={**os.environ, ENV_EXIT_FILE: str(exit_file)}, start_new_session=True)

        def forward(signum: int, _frame: FrameType | None) -> None:
            child.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, forward)
        rc = child.wait()
        if rc != 0 and (code := permanent_code(exit_file)) is not None:
            return code
        return rc if rc >= 0 else 128 - rc  # killed by a signal: report it the shell's way


if __name__ == "__main__":
    sys.exit(main())
