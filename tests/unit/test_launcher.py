"""The pod's launcher (`finetune_trainer.launch`): which exit code the container gets, and that a permanent
record stops the whole process tree at once while anything else is left to the launch.

The process tests run the launcher as the pod does (`python -m finetune_trainer.launch -- COMMAND`) around small
Python programs that behave like `accelerate launch`: no torch, a second or so each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from finetune_api.termination import TerminationRecord
from finetune_trainer.launch import exit_code

RECORD_65 = TerminationRecord(exit_code=65, reason="BadDatasetError", message="data.textField 'x' is not a column")
PUSH_FAILED = TerminationRecord(exit_code=1, reason="PushFailedError", message="push to org/repo failed 5 times")


@pytest.mark.parametrize(
    ("launch_rc", "record", "terminated", "expected"),
    [
        (0, None, False, 0),
        (0, RECORD_65, False, 0),
        (1, RECORD_65, False, 65),
        (-9, RECORD_65, False, 65),
        (1, RECORD_65, True, 65),
        (1, PUSH_FAILED, False, 1),
        (1, None, True, 143),
        (-15, None, True, 143),
        (1, None, False, 1),
        (-9, None, False, 137),
    ],
    ids=[
        "a clean launch exits 0",
        "a clean launch wins over a stale record",
        "accelerate's exit 1 becomes the worker's permanent 65",
        "the tree killed after a permanent record exits with the record's code",
        "a permanent record wins over a SIGTERM that came meanwhile",
        "a retryable record keeps the launch's code",
        "a forwarded SIGTERM exits 143 (checkpoint saved, retryable)",
        "a launch killed by the forwarded SIGTERM exits 143",
        "any other failure keeps the launch's code",
        "a launch killed by SIGKILL exits 128 + 9",
    ],
)
def test_exit_code(launch_rc: int, record: TerminationRecord | None, terminated: bool, expected: int) -> None:
    assert exit_code(launch_rc, record, terminated=terminated) == expected


# Stands in for `accelerate launch` + torch elastic: the "agent" starts a worker in a session of its own (as torchrun
# does), forwards SIGTERM to it, and restarts it after a failure, up to 3 times (max_restarts 3).
FAKE_AGENT = textwrap.dedent(
    """
    import signal, subprocess, sys, time

    worker, mode, pids, starts = sys.argv[1:]
    for restart in range(4):
        proc = subprocess.Popen([sys.executable, worker, mode, pids, starts], start_new_session=True)
        signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
        rc = proc.wait()
        if rc == 0 or mode == "sigterm":
            break
        time.sleep(0.3)
    sys.exit(1)
    """
)
# The worker: `permanent` writes a 65 record, leaves a helper process in yet another session (as a DataLoader worker
# might) and exits 65 half a second later; `retryable` writes a push-failure record and exits 1; `sigterm` waits
# for SIGTERM and exits 143. worker.pid names the process that must be gone at the end.
FAKE_WORKER = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    from pathlib import Path

    mode, pids, starts = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    with open(starts, "a") as f:
        f.write("start\\n")
    if mode == "sigterm":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        pids.write_text(str(os.getpid()))
        time.sleep(60)
    if mode == "permanent":
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        pids.write_text(str(helper.pid))
        record = {"exitCode": 65, "reason": "BadDatasetError", "message": "from the worker"}
    else:
        record = {"exitCode": 1, "reason": "PushFailedError", "message": "from the worker"}
    exit_file = os.environ["FTJOB_EXIT_FILE"]
    Path(exit_file + ".tmp").write_text(json.dumps(record))
    os.replace(exit_file + ".tmp", exit_file)
    time.sleep(0.5 if mode == "permanent" else 0)
    sys.exit(record["exitCode"])
    """
)


def launcher(tmp_path: Path, mode: str, **env: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    agent, worker = tmp_path / "fake_agent.py", tmp_path / "fake_worker.py"
    agent.write_text(FAKE_AGENT)
    worker.write_text(FAKE_WORKER)
    pids, starts = tmp_path / "worker.pid", tmp_path / "starts"
    cmd = [sys.executable, "-m", "finetune_trainer.launch", "--", sys.executable, str(agent), str(worker), mode,
           str(pids), str(starts)]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stderr=subprocess.PIPE)
    return proc, pids, starts


def gone(pid: int, timeout: float = 10) -> bool:
    """The process has exited (a zombie waiting for its new parent to reap it counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_permanent_record_stops_the_tree_at_once_and_becomes_the_exit_code(tmp_path: Path) -> None:
    termination_log = tmp_path / "termination-log"
    proc, pids, starts = launcher(tmp_path, "permanent", FTJOB_TERMINATION_LOG=str(termination_log))
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 65, stderr.decode()
    assert starts.read_text().count("start") == 1, "the fake agent restarted the worker: not stopped in time"
    assert gone(int(pids.read_text())), "the worker (in a session of its own) survived"
    assert b"stopping the worker group without an elastic restart" in stderr
    record = TerminationRecord.from_message(termination_log.read_text())
    assert record == TerminationRecord(exit_code=65, reason="BadDatasetError", message="from the worker")


def test_a_retryable_failure_is_left_to_the_launch(tmp_path: Path) -> None:
    termination_log = tmp_path / "termination-log"
    proc, _, starts = launcher(tmp_path, "retryable", FTJOB_TERMINATION_LOG=str(termination_log))
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr.decode()
    assert starts.read_text().count("start") == 4, "every restart of the fake agent ran"
    assert json.loads(termination_log.read_text())["reason"] == "PushFailedError"


def test_sigterm_is_forwarded_and_the_container_exits_143(tmp_path: Path) -> None:
    termination_log = tmp_path / "termination-log"
    proc, pids, _ = launcher(tmp_path, "sigterm", FTJOB_TERMINATION_LOG=str(termination_log))
    deadline = time.monotonic() + 30
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids.exists(), "the worker never started"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr.decode()
    assert gone(int(pids.read_text())), "the worker did not get the SIGTERM"
    assert not termination_log.exists(), "no worker left a record, so there is no termination message"


def test_without_a_command_the_launcher_says_how_to_call_it() -> None:
    proc = subprocess.run([sys.executable, "-m", "finetune_trainer.launch", "--"], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr
