"""`ftjob run`: the README's first command, end to end on CPU, and how it fits a job to the machine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from finetune_operator.local import fit_to_machine
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
