"""Fixtures for real CPU training runs: trainer.json builders, accelerate configs, and `accelerate launch`.

The accelerate YAMLs mirror what the operator renders for CPU (DEEPSPEED ZeRO-3 with `use_cpu: true` and
`DS_ACCELERATOR=cpu`; MULTI_GPU with `use_cpu: true` for plain DDP), and each run goes through the real
launcher with the operator's flags (`--rdzv_backend c10d --max_restarts 0`, loopback rendezvous). Nothing is
downloaded: the model and data are `builtin:`, made once per session under a temporary FTJOB_CACHE.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from finetune_api.trainer_input import TrainerInput
from finetune_operator.cli import load_job
from finetune_operator.render import RenderOptions, render_all

BIN = Path(sys.executable).parent

CONFIG_DIR = "/ftjob-test-config-dir"  # stands for the directory a test writes the files to


@dataclass(frozen=True)
class LaunchFiles:
    """accelerate.yaml (and deepspeed.json when DeepSpeed runs) as the operator renders them for the tiny
    2-process CPU job: tests train what pods run, from a directory of their own."""

    files: dict[str, str]

    def write(self, directory: Path, *, machine_rank: int, num_processes: int) -> Path:
        """Write the files, pointing accelerate.yaml at this directory; return the accelerate.yaml path."""
        for name, text in self.files.items():
            if name != "accelerate.yaml":
                (directory / name).write_text(text)
        accelerate = self.files["accelerate.yaml"].replace(CONFIG_DIR, str(directory))
        path = directory / f"accelerate-{machine_rank}.yaml"
        path.write_text(accelerate.replace("num_processes: 2", f"num_processes: {num_processes}"))
        return path


def rendered_launch_files(zero_stage: int) -> LaunchFiles:
    job = load_job(str(Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"))
    job.spec.distributed.deepspeed.zero_stage = zero_stage
    files = render_all(job, RenderOptions(config_dir=CONFIG_DIR)).files
    return LaunchFiles({k: v for k, v in files.items() if k in ("accelerate.yaml", "deepspeed.json")})


ZERO3_FILES = rendered_launch_files(3)  # DEEPSPEED (deepspeed.json), ZeRO-3, use_cpu
DDP_FILES = rendered_launch_files(0)  # MULTI_GPU (plain DDP over gloo), use_cpu


# Fast, deterministic defaults for the tiny model: ~0.1 s per step and process on one core.
TRAINING: dict[str, Any] = {
    "maxSteps": 12,
    "learningRate": 0.02,
    "lrSchedulerType": "constant",
    "warmupSteps": 0,
    "perDeviceTrainBatchSize": 2,
    "perDeviceEvalBatchSize": 4,
    "gradientAccumulationSteps": 1,
    "gradientCheckpointing": False,
    "mixedPrecision": "no",
    "seed": 7,
    "loggingSteps": 1,
    "evalStrategy": "no",
    "saveStrategy": "steps",
    "saveSteps": 4,
    "saveTotalLimit": 3,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def write_config(
    run_dir: Path,
    *,
    model: dict[str, Any] | None = None,
    dataset: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    output: dict[str, Any] | None = None,
    strategy: dict[str, Any] | None = None,
) -> Path:
    """trainer.json for the tiny model (camelCase keys, as the operator writes them), validated through TrainerInput;
    each keyword updates its section."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = TrainerInput.model_validate(
        {
            "job": {"name": run_dir.name, "namespace": "tests"},
            "model": {"name": "builtin:tiny-llama", "attnImplementation": "sdpa", **(model or {})},
            "dataset": {
                "name": "builtin:tiny-chat",
                "splits": ["train"],
                "maxSeqLen": 128,
                "packing": True,
                **(dataset or {}),
            },
            "adapter": {"r": 8, "alpha": 16, "dropout": 0.05, "targetModules": "all-linear"},
            "training": {**TRAINING, **(training or {})},
            "output": {
                "checkpointDir": str(run_dir / "checkpoints"),
                "adapterDir": str(run_dir / "checkpoints" / "adapter"),
                "probePath": str(run_dir / "probe.safetensors"),
                **(output or {}),
            },
            "strategy": {"dtype": "float32", **(strategy or {})},
        }
    )
    path = run_dir / "trainer.json"
    path.write_text(cfg.to_json())
    return path


@pytest.fixture(scope="session")
def trainer_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment of every launched process: private caches, offline, CPU DeepSpeed, one thread per rank."""
    cache = tmp_path_factory.mktemp("ftjob-cache")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FTJOB_", "HF_", "ACCELERATE_"))}
    env.update(
        FTJOB_CACHE=str(cache),
        HF_HOME=str(cache / "hf"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        PYTHONWARNINGS="ignore",
    )
    # Build the built-ins once, so concurrent ranks and tests only ever read them.
    code = "from finetune_trainer import builtin as b; b.resolve_model(b.TINY_LLAMA); b.resolve_dataset(b.TINY_CHAT)"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    return env


@dataclass
class Launch:
    """One `accelerate launch` process group and its log."""

    proc: subprocess.Popen[bytes]
    log: Path

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the launcher and every descendant: torchrun puts its workers in their own sessions, so a
        process-group kill alone would leave them running; this is what losing the pod looks like."""
        import psutil

        try:
            family = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        for p in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
        self.proc.wait(timeout=60)
        psutil.wait_procs(family, timeout=30)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def launch(
    config: Path,
    env: dict[str, str],
    *,
    files: LaunchFiles,
    num_processes: int = 2,
    num_machines: int = 1,
    machine_rank: int = 0,
    port: int | None = None,
    extra_env: dict[str, str] | None = None,
    log_name: str = "launch.log",
) -> Launch:
    """Start the operator's node command: accelerate launch ... -m finetune_trainer --config trainer.json."""
    yaml_path = files.write(config.parent, machine_rank=machine_rank, num_processes=num_processes)
    cmd = [
        str(BIN / "accelerate"), "launch", "--config_file", str(yaml_path),
        "--num_machines", str(num_machines), "--num_processes", str(num_processes),
        "--machine_rank", str(machine_rank), "--main_process_ip", "127.0.0.1",
        "--main_process_port", str(port or free_port()), "--rdzv_backend", "c10d", "--max_restarts", "0",
        "-m", "finetune_trainer", "--config", str(config),
    ]  # fmt: skip
    if num_machines == 1:
        # One machine: accelerate hands torchrun no rdzv endpoint, and c10d then defaults to localhost:29400,
        # so two concurrent runs on one host (parallel tests, `ftjob run`) would share a store. Pin it.
        extra_env = {"PET_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", **(extra_env or {})}
    log = config.parent / log_name
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, env={**env, **(extra_env or {})}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Launch(proc, log)


def run(config: Path, env: dict[str, str], *, timeout: float = 300, **kwargs: Any) -> Launch:
    """Launch and wait; fail with the log's tail when the run does not exit 0."""
    job = launch(config, env, **kwargs)
    rc = job.wait(timeout)
    assert rc == 0, f"exit {rc}\n{job.text()[-6000:]}"
    return job


def losses(run_dir: Path) -> dict[int, float]:
    """Training loss per step from metrics.jsonl; a later line for a step (after a resume) wins."""
    out: dict[int, float] = {}
    for line in (run_dir / "checkpoints" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:
            out[int(row["step"])] = float(row["loss"])
    return out


def wait_for(predicate: Any, *, timeout: float, what: str, job: Launch | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if job is not None and job.proc.poll() is not None:
            pytest.fail(f"run exited ({job.proc.returncode}) before {what}\n{job.text()[-4000:]}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="session")
def zero3_run(tmp_path_factory: pytest.TempPathFactory, trainer_env: dict[str, str]) -> Iterator[Path]:
    """One uninterrupted ZeRO-3, 2-process run shared by the training and resume tests."""
    run_dir = tmp_path_factory.mktemp("zero3")
    run(write_config(run_dir, strategy={"numProcesses": 2, "zeroStage": 3, "useCpu": True}), trainer_env,
        files=ZERO3_FILES)  # fmt: skip
    yield run_dir
