"""Crash and stop: kill -9 mid-run resumes from the newest complete checkpoint with identical losses, a torn
checkpoint (no completion marker) is set aside, and SIGTERM to the launcher leaves a complete checkpoint."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from finetune_trainer.checkpoints import MARKER, newest_complete
from tests.trainer.launching import ZERO3_FILES, launch, losses, run, wait_for, write_config

pytestmark = pytest.mark.trainer

ZERO3 = {"numProcesses": 2, "zeroStage": 3, "useCpu": True}


def test_kill_9_mid_run_resumes_with_the_uninterrupted_losses(
    tmp_path: Path, trainer_env: dict[str, str], zero3_run: Path
) -> None:
    config = write_config(tmp_path, strategy=ZERO3)  # the same job as zero3_run
    ckpts = tmp_path / "checkpoints"
    job = launch(config, trainer_env, files=ZERO3_FILES, log_name="killed.log")
    wait_for(lambda: (ckpts / "checkpoint-4" / MARKER).exists(), timeout=240, what="checkpoint-4", job=job)
    job.kill(signal.SIGKILL)
    resume_from = newest_complete(ckpts)
    assert resume_from is not None
    # A save that died half-way: files but no marker, newer than anything complete.
    shutil.copytree(resume_from, ckpts / "checkpoint-11")
    (ckpts / "checkpoint-11" / MARKER).unlink()

    resumed = run(config, trainer_env, files=ZERO3_FILES, log_name="resumed.log")

    assert f"resuming from {resume_from}" in resumed.text()
    assert not (ckpts / "checkpoint-11").exists() and list(ckpts.glob("torn-checkpoint-11-*"))
    step = int(resume_from.name.split("-")[1])
    expected, got = losses(zero3_run), losses(tmp_path)
    after = [s for s in sorted(expected) if s > step]
    assert after and [got[s] for s in after] == pytest.approx([expected[s] for s in after], rel=1e-5, abs=1e-6)
    print(f"resumed from step {step}; losses after resume: {[(s, got[s], expected[s]) for s in after]}")


def test_sigterm_to_the_launcher_saves_a_complete_checkpoint(tmp_path: Path, trainer_env: dict[str, str]) -> None:
    config = write_config(tmp_path, training={"maxSteps": 500, "saveSteps": 1000}, strategy=ZERO3)
    ckpts = tmp_path / "checkpoints"
    job = launch(config, trainer_env, files=ZERO3_FILES)
    metrics = ckpts / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, timeout=240, what="3 steps",
             job=job)  # fmt: skip
    os.kill(job.proc.pid, signal.SIGTERM)  # what the kubelet does: SIGTERM to the container's PID 1 only
    rc = job.wait(120)
    assert rc != 0, "a SIGTERM-stopped run must not look like success"
    saved = newest_complete(ckpts)
    assert saved is not None, job.text()[-4000:]
    assert "SIGTERM: saving a checkpoint" in job.text()
    assert 3 <= int(saved.name.split("-")[1]) < 500
