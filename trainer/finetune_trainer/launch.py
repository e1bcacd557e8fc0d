"""`python -m finetune_trainer.launch -- accelerate launch ...`: the trainer pod's command, around the launch.

Two things go wrong when a pod runs `accelerate launch` directly:

- accelerate exits 1 for any worker failure (its single-process launcher raises `CalledProcessError`, torchrun
  `ChildFailedError`), so the container can never exit 64/65/66 and the attempt Job's podFailurePolicy rule
  (`FailJob` on those codes) could never fire;
- torch elastic restarts the worker group `--max_restarts` times after any worker failure, a permanent one
  included, and each restart loads the model again only to fail the same way (measured with the tiny example,
  `maxRestarts: 2` and a missing text field: three runs, 22 s, then exit 1).

So this launcher runs the given command in a session of its own with `FTJOB_EXIT_FILE` pointing into a private
temporary directory. A worker that fails knowingly writes its `TerminationRecord` there before exiting
(`errors.report`). The launcher looks at the file every `POLL_SECONDS`, well within the elastic agent's 1 s
monitor interval. On a permanent record it stops the whole process tree at once (`stop_tree`) and exits with the
record's code. Nothing is saved first: the inputs are wrong, and a checkpoint would wait in a collective for the
rank that already left. SIGTERM and SIGINT are forwarded to the launch: the agent passes them to the workers,
which save a checkpoint and exit 143 (`checkpoints.SaveOnSigterm`), and the launcher then exits 143 as well
(`exit_code`). When the container exits non-zero, the newest record goes into its termination message
(`/dev/termination-log`, or `FTJOB_TERMINATION_LOG`), where the operator reads it.

The launch also gets `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (unless set): with torch's default, the elastic agent
keeps one TCPStore for every round of the c10d rendezvous, and the workers of a restarted group can read the
previous group's keys (pytorch/pytorch#135712). Measured with torch 2.14 and gloo (torchrun, two processes, one
worker exiting 1 once, `--max_restarts 2`): with the shared store 2 of 5 runs hung in the restarted group's
`init_process_group` and 1 failed; with a store per round 5 of 5 restarted and finished.

The pod's `command` replaces the image's entrypoint (tini), so in a pod this process is PID 1: it installs
handlers for the signals it forwards (PID 1 ignores the rest) and reaps orphaned descendants.

Usage (`render/command.py` builds it for pods and `ftjob run`):

    python -m finetune_trainer.launch -- accelerate launch --config_file /etc/ftjob/accelerate.yaml ... \\
        -m finetune_trainer --config /etc/ftjob/trainer.json
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

from finetune_api import constants
from finetune_api.termination import TerminationRecord

POLL_SECONDS = 0.1
"""How often the exit file is read: a tenth of the elastic agent's monitor interval, so a permanent failure is
seen before the agent has restarted the group (and a restarted worker is killed long before it loads a model)."""
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
FORWARDED = (signal.SIGTERM, signal.SIGINT)
ROUND_STORES = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""A TCPStore per rendezvous round, so a restarted worker group never reads the last group's keys."""


def exit_code(launch_rc: int, record: TerminationRecord | None, *, terminated: bool) -> int:
    """The container's exit code: the launch's success; else a permanent record's code; 143 after a forwarded
    SIGTERM/SIGINT; else the launch's own code (killed by signal N: 128 + N, the shell's way)."""
    if launch_rc == 0:
        return 0
    if record is not None and record.permanent:
        return record.exit_code
    if terminated:
        return constants.EXIT_SIGTERM
    return launch_rc if launch_rc > 0 else 128 - launch_rc


def read_record(path: Path) -> TerminationRecord | None:
    """The record a worker left, if any."""
    try:
        text = path.read_text()
    except OSError:
        return None
    return TerminationRecord.from_message(text)


def stop_tree(pid: int) -> None:
    """SIGKILL `pid` and every descendant. torchrun starts its workers in sessions of their own, so a
    process-group signal would miss them; each process is stopped (SIGSTOP) before its children are listed, so
    none can start another while the tree is taken down."""
    import psutil  # type: ignore[import-untyped]

    frozen: list[psutil.Process] = []
    todo = [pid]
    while todo:
        try:
            proc = psutil.Process(todo.pop())
            proc.suspend()
            frozen.append(proc)
            todo.extend(child.pid for child in proc.children())
        except psutil.NoSuchProcess:
            continue
    for proc in frozen:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def write_termination_message(record: TerminationRecord) -> None:
    """Kubernetes keeps the file's content as `state.terminated.message`; outside a pod there is no such file."""
    configured = os.environ.get(constants.ENV_TERMINATION_LOG)
    path = Path(configured or DEFAULT_TERMINATION_LOG)
    if configured or path.exists():
        with contextlib.suppress(OSError):
            path.write_text(record.to_message())


def _reap_orphans(launch_pid: int) -> None:
    """As PID 1, collect the exit status of orphaned descendants (left to us by the kernel), never the launch's."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == launch_pid:
            return
        os.waitpid(info.si_pid, 0)


def _say(message: str) -> None:
    print(f"finetune_trainer.launch: {message}", file=sys.stderr, flush=True)


def run(command: list[str]) -> int:
    """Run `command` until it ends or a worker fails permanently; return the container's exit code."""
    terminated = False
    with tempfile.TemporaryDirectory(prefix="ftjob-exit-") as tmp:
        exit_file = Path(tmp) / "termination.json"
        env = {**ROUND_STORES, **os.environ, constants.ENV_EXIT_FILE: str(exit_file)}
        launch = subprocess.Popen(command, env=env, start_new_session=True)

        def forward(signum: int, _frame: FrameType | None) -> None:
            nonlocal terminated
            terminated = True
            with contextlib.suppress(ProcessLookupError):
                launch.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
        reaping = os.getpid() == 1 and hasattr(os, "waitid")
        try:
            while True:
                try:
                    rc = launch.wait(timeout=POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    pass
                record = read_record(exit_file)
                if record is not None and record.permanent:
                    _say(
                        f"a worker failed permanently (exit {record.exit_code}, {record.reason}); stopping the "
                        "worker group without an elastic restart"
                    )
                    stop_tree(launch.pid)
                    rc = launch.wait()
                    break
                if reaping:
                    _reap_orphans(launch.pid)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        record = read_record(exit_file)
    code = exit_code(rc, record, terminated=terminated)
    if code != 0 and record is not None:
        write_termination_message(record)
    return code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[1:] if args[:1] == ["--"] else args
    if not command:
        print("usage: python -m finetune_trainer.launch -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return run(command)


if __name__ == "__main__":
    sys.exit(main())
