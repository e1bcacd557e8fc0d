"""`ftjob run`: the README's first command, end to end on CPU, and how it fits a job to the machine; what it
prints (a screenful by default, everything with `--verbose`); a permanent trainer error ends the run at once with
its own code; `--fresh` starts over; `plan`, `render` and `run` reject an invalid job alike."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api import constants
from finetune_operator.local import first_failure, fit_to_machine
from tests.builders import job

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("gpus_here", "nodes", "expected"),
    [(0, None, (1, 0, 1)), (0, 2, (2, 0, 1)), (8, None, (1, 8, None))],
    ids=["no GPU here: the job runs on CPU", "--nodes splits it into local nodes", "enough GPUs: unchanged"],
)
def test_fit_to_machine(gpus_here: int, nodes: int | None, expected: tuple[int, int, int | None]) -> None:
    fitted, notes = fit_to_machine(job(gpus=8), nodes=nodes, gpus_here=gpus_here)
    dist = fitted.spec.distributed
    assert (dist.nodes, dist.gpus_per_node, dist.processes_per_node) == expected
    assert bool(notes) == (gpus_here == 0)


def test_too_few_gpus_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="wants 2 x 8 GPUs and this machine has 4"):
        fit_to_machine(job(nodes=2, gpus=8), nodes=None, gpus_here=4)


@pytest.mark.trainer
def test_ftjob_run_trains_the_tiny_example(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", "run", "examples/tiny-cpu.yaml", "--workdir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    adapter = tmp_path / "checkpoints" / "adapter"
    assert f"adapter: {adapter}" in proc.stdout and "loss curve:" in proc.stdout
    assert (adapter / "adapter_model.safetensors").stat().st_size > 1000
    rows = [json.loads(line) for line in (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert losses[-1] < losses[0] - 1.0, losses
    assert (tmp_path / "config" / "accelerate.yaml").read_text().count("num_processes: 2") == 1
    assert_quiet(proc.stdout + proc.stderr, logged_steps=[1, 5, 10, 15, 20, 25, 30], max_steps=30)


STEP_LINE = re.compile(r"\[rank0\] INFO finetune_trainer\.progress: step (\d+)/(\d+) ")
WARNING_LINE = re.compile(r"\] WARNING (\S+): (.*)$")


def assert_quiet(output: str, *, logged_steps: list[int], max_steps: int) -> None:
    """What `ftjob run` prints by default (finetune_trainer.output): a screenful, each warning once, one line per
    logging step, from rank 0 only, no progress bar or dict print in a pipe, and a line on what was left out."""
    lines = output.splitlines()
    assert len(lines) <= 40, f"{len(lines)} lines:\n{output}"
    warnings = [m.group(2) for line in lines if (m := WARNING_LINE.search(line))]
    assert len(warnings) == len(set(warnings)), f"a warning printed twice:\n{output}"
    assert "Warning: " not in "".join(line for line in lines if not WARNING_LINE.search(line)), output
    step_lines = [m for m in map(STEP_LINE.search, lines) if m]
    assert [int(m.group(1)) for m in step_lines] == logged_steps, output
    assert {int(m.group(2)) for m in step_lines} == {max_steps}, output
    assert "[rank1]" not in output and "{'loss'" not in output and "it/s]" not in output, output
    assert "more times (not shown); --verbose" in output, output


@pytest.mark.trainer
def test_ftjob_run_verbose_shows_every_warning_and_every_rank(tmp_path: Path) -> None:
    path = tiny_job(tmp_path, spec={"training": {"maxSteps": 10, "saveSteps": 10}})
    quiet = ftjob("run", str(path), "--workdir", str(tmp_path / "quiet"))
    verbose = ftjob("run", str(path), "--workdir", str(tmp_path / "verbose"), "--verbose")
    assert quiet.returncode == 0 and verbose.returncode == 0, (quiet.stdout[-3000:], verbose.stdout[-3000:])
    assert_quiet(quiet.stdout + quiet.stderr, logged_steps=[1, 5, 10], max_steps=10)
    loud = verbose.stdout + verbose.stderr
    assert len(loud.splitlines()) > len(quiet.stdout.splitlines()) + 20, loud
    assert loud.count("`torch.distributed.reduce_scatter_tensor` is deprecated") > 2, loud[-3000:]
    assert "[rank1]" in loud and "not shown" not in loud


def ftjob(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})},
    )


def tiny_job(tmp_path: Path, *, spec: dict[str, Any]) -> Path:
    """examples/tiny-cpu.yaml with parts of its spec replaced (one level deep), written to tmp_path."""
    body = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    for key, value in spec.items():
        body["spec"][key] = {**body["spec"][key], **value} if isinstance(value, dict) else value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.mark.parametrize(
    ("codes", "expected"),
    [([0, 0], 0), ([143, 65], 65), ([1, 143], 1), ([143, 1, 66], 66)],
    ids=[
        "every node done: 0",
        "a permanent code wins over the SIGTERM that stopped the other node",
        "else the first failure",
        "a permanent code wins over an earlier plain failure",
    ],
)
def test_first_failure(codes: list[int], expected: int) -> None:
    assert first_failure(codes) == expected


def test_plan_render_and_run_reject_an_invalid_job_alike(tmp_path: Path) -> None:
    distributed = {"gpusPerNode": 0, "processesPerNode": None, "deepspeed": {"zeroStage": 3, "offloadParams": "nvme"}}
    path = tiny_job(tmp_path, spec={"distributed": distributed})
    out, workdir = tmp_path / "rendered", tmp_path / "run"
    results = {
        "plan": ftjob("plan", str(path)),
        "render": ftjob("render", str(path), "--out", str(out)),
        "run": ftjob("run", str(path), "--workdir", str(workdir), "--fresh"),
    }
    errors = {}
    for command, proc in results.items():
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        first, *rest = proc.stderr.splitlines()
        assert first == f"ftjob {command}: invalid FineTuneJob:"
        errors[command] = rest
    assert errors["plan"] == errors["render"] == errors["run"]
    paths = sorted(line.split(":")[0].strip() for line in errors["plan"])
    assert paths == ["spec.distributed.deepspeed.nvmePath", "spec.distributed.processesPerNode"], errors["plan"]
    assert not out.exists() and not workdir.exists(), "an invalid job wrote or deleted files"
    assert all(proc.stdout == "" for proc in results.values())


MAX_RESTARTS_3 = {"rendezvous": {"backend": "c10d", "port": 29517, "maxRestarts": 3}}


def started(output: str) -> int:
    """How many times the trainer started (its main process logs this line once per start of the group)."""
    return output.count("INFO finetune_trainer: job default/tiny-cpu:")


@pytest.mark.trainer
def test_a_bad_dataset_fails_at_once_with_exit_65_and_fresh_starts_over(tmp_path: Path) -> None:
    path = tiny_job(tmp_path, spec={"dataset": {"textField": "nosuchfield"}, "distributed": MAX_RESTARTS_3})
    workdir = tmp_path / "run"
    stale = workdir / "checkpoints" / "checkpoint-30"
    stale.mkdir(parents=True)
    (stale / "checkpoint-complete.json").write_text('{"step": 30}')
    proc = ftjob("run", str(path), "--workdir", str(workdir), "--fresh")
    output = proc.stdout + proc.stderr
    assert proc.returncode == constants.EXIT_BAD_DATASET, output[-6000:]
    assert "ftjob run: failed with exit code 65 (permanent: bad dataset" in proc.stderr
    assert started(output) == 1, output[-6000:]  # maxRestarts 3, yet no elastic restart
    assert "dataset.textField 'nosuchfield' is not a column" in output
    assert not stale.exists() and "resuming" not in output, "--fresh did not start over"


@pytest.mark.trainer
def test_a_permanent_error_after_the_model_load_loads_it_once(tmp_path: Path) -> None:
    path = tiny_job(tmp_path, spec={"distributed": MAX_RESTARTS_3})
    fault = {constants.ENV_TEST_FAULT: f"exit:{constants.EXIT_INVALID_CONFIG}"}
    proc = ftjob("run", str(path), "--workdir", str(tmp_path / "run"), env=fault)
    output = proc.stdout + proc.stderr
    assert proc.returncode == constants.EXIT_INVALID_CONFIG, output[-6000:]
    assert output.count("INFO finetune_trainer: model loaded from") == 1, output[-6000:]
    assert started(output) == 1
