"""Permanent errors exit with their own code and a message naming the field, before any training starts.

These call `finetune_trainer.__main__.main` in-process (one process, no launcher): the error paths all run
before the model is built, so there is nothing distributed to set up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_api.constants import EXIT_BAD_DATASET, EXIT_INVALID_CONFIG, EXIT_UNKNOWN_MODEL
from tests.trainer.launching import write_config

pytestmark = pytest.mark.trainer


@pytest.fixture(autouse=True)
def _env(trainer_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ("FTJOB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "OMP_NUM_THREADS"):
        monkeypatch.setenv(key, trainer_env[key])
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    monkeypatch.setenv("FTJOB_TERMINATION_LOG", str(tmp_path / "termination-log"))


def run_main(config: Path) -> int:
    from finetune_trainer.__main__ import main

    return main(["--config", str(config)])


def test_dataset_without_the_text_field_exits_65_naming_field_and_columns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": f"a{i}"}) + "\n" for i in range(8)))
    config = write_config(tmp_path, data={"name_or_path": str(data), "text_field": "content"})
    assert run_main(config) == EXIT_BAD_DATASET
    assert "data.textField 'content' is not a column" in caplog.text
    assert "['prompt', 'answer']" in caplog.text
    termination = json.loads((tmp_path / "termination-log").read_text())
    assert termination["exitCode"] == EXIT_BAD_DATASET and "'content'" in termination["message"]


def test_missing_dataset_file_exits_65(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = write_config(tmp_path, data={"name_or_path": str(tmp_path / "nope.jsonl")})
    assert run_main(config) == EXIT_BAD_DATASET
    assert "nope.jsonl" in caplog.text


def test_unknown_model_path_exits_66(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = write_config(tmp_path, model={"name_or_path": "/models/does-not-exist", "dtype": "float32"})
    assert run_main(config) == EXIT_UNKNOWN_MODEL
    assert "model.name_or_path: local path '/models/does-not-exist' does not exist" in caplog.text


def test_invalid_trainer_json_exits_64_naming_the_field(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = write_config(tmp_path)
    raw = json.loads(config.read_text())
    raw["training"]["learning_rate"] = "fast"
    raw["lora"]["rank"] = 8
    config.write_text(json.dumps(raw))
    assert run_main(config) == EXIT_INVALID_CONFIG
    assert "training.learning_rate" in caplog.text and "lora.rank" in caplog.text


NO_YAML = """\
compute_environment: LOCAL_MACHINE
distributed_type: 'NO'
mixed_precision: 'no'
use_cpu: true
num_machines: 1
num_processes: 1
machine_rank: 0
main_training_function: main
"""


def test_launch_wrapper_keeps_exit_65_that_accelerate_launch_turns_into_1(
    tmp_path: Path, trainer_env: dict[str, str]
) -> None:
    import subprocess
    import sys

    config = write_config(tmp_path, data={"text_field": "nope"})
    (tmp_path / "accelerate.yaml").write_text(NO_YAML)
    args = ["--config_file", str(tmp_path / "accelerate.yaml"), "--num_machines", "1", "--num_processes", "1",
            "-m", "finetune_trainer", "--config", str(config)]  # fmt: skip
    env = {k: v for k, v in trainer_env.items() if k != "FTJOB_EXIT_FILE"}
    wrapped = subprocess.run([sys.executable, "-m", "finetune_trainer.launch", *args], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    assert wrapped.returncode == EXIT_BAD_DATASET, wrapped.stderr[-3000:]
    assert "data.textField 'nope' is not a column" in wrapped.stderr
