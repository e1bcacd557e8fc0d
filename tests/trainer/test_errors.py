"""Permanent errors exit with their own code and a message naming the field; through the pod's command they stop
the worker group at once, while a transient crash is still restarted by torch elastic.

The first tests call `finetune_trainer.__main__.main` in-process (one process, no launcher): the error paths all
run before the model is built, so there is nothing distributed to set up. The others run the node command
exactly as `render/command.py` renders it for a pod (the launcher around `accelerate launch`, 2 processes,
ZeRO-3 on CPU), with loopback for node 0's address and this interpreter for `python`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from finetune_api import constants
from finetune_api.constants import EXIT_BAD_DATASET, EXIT_INVALID_CONFIG, EXIT_UNKNOWN_MODEL
from finetune_api.termination import TerminationRecord
from finetune_operator.cli import load_job
from finetune_operator.render import RenderOptions, render_all
from finetune_operator.render.command import LAUNCHER, render_node_command
from tests.trainer.launching import free_port, wait_for, write_config

pytestmark = pytest.mark.trainer


@pytest.fixture(autouse=True)
def _env(trainer_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ("FTJOB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "OMP_NUM_THREADS"):
        monkeypatch.setenv(key, trainer_env[key])
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    monkeypatch.setenv(constants.ENV_EXIT_FILE, str(tmp_path / "exit.json"))  # as the launcher sets it


def run_main(config: Path) -> int:
    from finetune_trainer.__main__ import main

    return main(["--config", str(config)])


def test_dataset_without_the_text_field_exits_65_naming_field_and_columns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": f"a{i}"}) + "\n" for i in range(8)))
    config = write_config(tmp_path, dataset={"name": str(data), "textField": "content"})
    assert run_main(config) == EXIT_BAD_DATASET
    assert "dataset.textField 'content' is not a column" in caplog.text
    assert "['prompt', 'answer']" in caplog.text
    record = json.loads((tmp_path / "exit.json").read_text())
    assert record["exitCode"] == EXIT_BAD_DATASET and record["reason"] == "BadDatasetError"
    assert "'content'" in record["message"]


def test_missing_dataset_file_exits_65(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = write_config(tmp_path, dataset={"name": str(tmp_path / "nope.jsonl")})
    assert run_main(config) == EXIT_BAD_DATASET
    assert "nope.jsonl" in caplog.text


def test_unknown_model_path_exits_66(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = write_config(tmp_path, model={"name": "/models/does-not-exist"})
    assert run_main(config) == EXIT_UNKNOWN_MODEL
    assert "model.name: local path '/models/does-not-exist' does not exist" in caplog.text


def test_invalid_trainer_json_exits_64_naming_the_field(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = write_config(tmp_path)
    raw = json.loads(config.read_text())
    raw["training"]["learningRate"] = "fast"
    raw["adapter"]["rank"] = 8
    config.write_text(json.dumps(raw))
    assert run_main(config) == EXIT_INVALID_CONFIG
    assert "training.learningRate" in caplog.text and "adapter.rank" in caplog.text


REPO = Path(__file__).resolve().parents[2]
MODEL_LOADED = "model loaded from"  # logged once per model load, by the main process


@dataclass
class Node:
    """One node of the tiny example, run by its rendered command."""

    proc: subprocess.Popen[bytes]
    run_dir: Path

    @property
    def log(self) -> str:
        return (self.run_dir / "node.log").read_text(errors="replace")

    def wait(self, timeout: float = 600) -> int:
        """The launcher's exit code; fails when any process of the run (they all name its directory) outlives it."""
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            leftovers = self.kill_leftovers()
        assert not leftovers, f"processes of the run outlived its launcher: {leftovers}"
        return rc

    def kill_leftovers(self) -> list[str]:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(self.run_dir) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid}: {cmdline[:200]}")
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
        return found

    def termination(self) -> TerminationRecord | None:
        path = self.run_dir / "termination-log"
        return TerminationRecord.from_message(path.read_text()) if path.exists() else None


def start_node(run_dir: Path, trainer_env: dict[str, str], *, max_restarts: int, max_steps: int, **env: str) -> Node:
    """Render the tiny example (ZeRO-3, 2 CPU processes) and start node 0's pod command."""
    job = load_job(str(REPO / "examples" / "tiny-cpu.yaml"))
    job.spec.training.max_steps = max_steps
    job.spec.training.save_steps = 2
    job.spec.distributed.rendezvous.max_restarts = max_restarts
    job.spec.distributed.rendezvous.port = free_port()
    config_dir, checkpoints = run_dir / "config", run_dir / "checkpoints"
    config_dir.mkdir(parents=True)
    rendered = render_all(job, RenderOptions(config_dir=str(config_dir), checkpoint_dir=str(checkpoints)))
    for name, text in rendered.files.items():
        (config_dir / name).write_text(text)
    argv = render_node_command(rendered.context.on_local_node(0))
    assert argv[: len(LAUNCHER)] == list(LAUNCHER) and argv[len(LAUNCHER)] == "accelerate"
    argv[0] = sys.executable
    node_env = {
        **trainer_env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{trainer_env.get('PATH', '')}",  # its `accelerate`
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{job.spec.distributed.rendezvous.port}",  # one machine: pin c10d's store
        constants.ENV_TERMINATION_LOG: str(run_dir / "termination-log"),
        **env,
    }
    with open(run_dir / "node.log", "wb") as log:
        proc = subprocess.Popen(argv, env=node_env, stdout=log, stderr=subprocess.STDOUT)
    return Node(proc, run_dir)


def test_a_permanent_error_with_max_restarts_3_loads_the_model_once_and_exits_with_its_code(
    tmp_path: Path, trainer_env: dict[str, str]
) -> None:
    fault = {constants.ENV_TEST_FAULT: f"exit:{EXIT_UNKNOWN_MODEL}"}  # raised on every rank after the model load
    node = start_node(tmp_path, trainer_env, max_restarts=3, max_steps=4, **fault)
    rc = node.wait()
    assert rc == EXIT_UNKNOWN_MODEL, node.log[-6000:]
    assert node.log.count(MODEL_LOADED) == 1, node.log[-6000:]
    assert "stopping the worker group without an elastic restart" in node.log
    record = node.termination()
    assert record is not None and record.exit_code == EXIT_UNKNOWN_MODEL and record.reason == "UnknownModelError"


def test_a_worker_killed_once_is_restarted_by_elastic_and_the_run_succeeds(
    tmp_path: Path, trainer_env: dict[str, str]
) -> None:
    crashed = tmp_path / "crashed"
    fault = {constants.ENV_TEST_FAULT: f"crash-once:{crashed}"}  # the first worker to get there SIGKILLs itself
    node = start_node(tmp_path, trainer_env, max_restarts=3, max_steps=4, **fault)
    rc = node.wait()
    assert rc == 0, node.log[-6000:]
    assert crashed.exists(), "the fault never fired"
    assert node.log.count(MODEL_LOADED) == 2, node.log[-6000:]  # the first run, and elastic's restart
    assert (tmp_path / "checkpoints" / "adapter" / "adapter_model.safetensors").exists()
    assert node.termination() is None


def test_sigterm_to_the_pod_command_saves_a_checkpoint_and_exits_143(
    tmp_path: Path, trainer_env: dict[str, str]
) -> None:
    from finetune_trainer.checkpoints import newest_complete

    node = start_node(tmp_path, trainer_env, max_restarts=3, max_steps=500)
    metrics = tmp_path / "checkpoints" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, timeout=300, what="3 steps")
    node.proc.send_signal(signal.SIGTERM)  # what the kubelet does: SIGTERM to the container's PID 1 only
    rc = node.wait(180)
    assert rc == constants.EXIT_SIGTERM, node.log[-6000:]
    assert "SIGTERM: saving a checkpoint" in node.log
    saved = newest_complete(tmp_path / "checkpoints")
    assert saved is not None and 3 <= int(saved.name.split("-")[1]) < 500
