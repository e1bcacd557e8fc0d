"""trainer.json's schemaVersion: a newer minor is read with a warning, another major is refused (exit 64).

The operator and the trainer image are upgraded separately, so a trainer must read what a newer operator of the
same major version writes, and every file an older operator of the same major version wrote. Cases: the layout
written today, the frozen 2.0 file, one from a newer minor version (unknown fields at the top and nested), an
unknown field at today's version (a typo: still an error), a newer major version, and files of the 1.x layout
(snake_case copy of the spec), with and without `schemaVersion`. The minor version counts the fields added since
MAJOR.0 (a new spec option bumps it with no edit); a field removed or renamed fails here, asking for a major bump.
"""

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.constants import EXIT_INVALID_CONFIG
from finetune_api.trainer_input import SCHEMA_MAJOR, SCHEMA_VERSION, TrainerInput, field_paths
from finetune_api.v1alpha1 import FineTuneJob
from finetune_operator.render import render_all
from finetune_trainer.errors import InvalidConfigError
from finetune_trainer.loading import load_config

MAJOR = int(SCHEMA_VERSION.split(".")[0])
BASELINE = Path(__file__).resolve().parents[1] / "golden" / "trainer-input"  # the layout at MAJOR.0, frozen

# The start of a trainer.json as the 1.x layout wrote it (enough for the reader to tell the version).
LAYOUT_1 = {
    "schemaVersion": "1.0",
    "job": {"name": "tiny-cpu", "namespace": "default"},
    "model": {"name_or_path": "builtin:tiny-llama", "dtype": "float32"},
    "data": {"name_or_path": "builtin:tiny-chat"},
    "lora": {"r": 8},
    "distributed": {"num_processes": 2, "zero_stage": 3, "use_cpu": True},
}


def _written_today() -> dict[str, Any]:
    body = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml").read_text())
    trainer = render_all(FineTuneJob.from_body(body)).trainer
    raw: dict[str, Any] = json.loads(trainer.to_json())
    return raw


def _write(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "trainer.json"
    path.write_text(json.dumps(raw))
    return path


def test_todays_layout_carries_its_version_and_reads_back_unchanged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw = _written_today()
    assert raw["schemaVersion"] == SCHEMA_VERSION
    with caplog.at_level(logging.WARNING):
        cfg = load_config(_write(tmp_path, raw))
    assert cfg == TrainerInput.model_validate(raw)
    assert json.loads(cfg.to_json()) == raw
    assert caplog.records == []


def test_the_minor_version_counts_the_fields_added_since_the_major_began() -> None:
    at_major = (BASELINE / f"{SCHEMA_MAJOR}.0-fields.txt").read_text().split()
    today = field_paths(TrainerInput)
    gone = [path for path in at_major if path not in today]
    assert gone == [], (
        f"fields of the {SCHEMA_MAJOR}.0 layout are gone or renamed: a major bump (SCHEMA_MAJOR, _FIELDS_AT_MAJOR, "
        "and a new baseline in tests/golden/trainer-input)"
    )
    assert f"{SCHEMA_MAJOR}.{len(today) - len(at_major)}" == SCHEMA_VERSION


def test_a_file_an_older_operator_of_this_major_wrote_reads_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw = json.loads((BASELINE / f"{SCHEMA_MAJOR}.0-example-tiny-cpu.json").read_text())
    with caplog.at_level(logging.WARNING):
        cfg = load_config(_write(tmp_path, raw))
    assert cfg.schema_version == f"{SCHEMA_MAJOR}.0" and cfg.dataset.name == "builtin:tiny-chat"
    assert caplog.records == []


def test_a_newer_minor_version_drops_unknown_fields_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw = _written_today() | {"schemaVersion": f"{MAJOR}.99", "curriculum": {"stages": 3}}
    raw["training"] = raw["training"] | {"fancyNewOption": True}
    raw["output"] = raw["output"] | {"hub": {"repoId": "org/x", "mirror": "s3://b"}}
    with caplog.at_level(logging.WARNING):
        cfg = load_config(_write(tmp_path, raw))
    assert cfg.training == TrainerInput.model_validate(_written_today()).training
    assert cfg.output.hub is not None and cfg.output.hub.repo_id == "org/x"
    assert cfg.schema_version == f"{MAJOR}.99"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "curriculum" in warnings[0] and "training.fancyNewOption" in warnings[0]
    assert "output.hub.mirror" in warnings[0]
    assert f"{MAJOR}.99" in warnings[0] and SCHEMA_VERSION in warnings[0]


def test_an_unknown_field_at_this_version_is_still_an_error(tmp_path: Path) -> None:
    raw = _written_today()
    raw["training"] = raw["training"] | {"learningRat": 1e-3}
    with pytest.raises(InvalidConfigError, match=r"training\.learningRat") as err:
        load_config(_write(tmp_path, raw))
    assert err.value.exit_code == EXIT_INVALID_CONFIG


def test_another_major_version_is_refused_naming_both(tmp_path: Path) -> None:
    newer = f"{MAJOR + 1}.0"
    with pytest.raises(InvalidConfigError) as err:
        load_config(_write(tmp_path, _written_today() | {"schemaVersion": newer}))
    assert newer in str(err.value) and SCHEMA_VERSION in str(err.value)
    assert err.value.exit_code == EXIT_INVALID_CONFIG


@pytest.mark.parametrize(
    "raw",
    [LAYOUT_1, {k: v for k, v in LAYOUT_1.items() if k != "schemaVersion"}],
    ids=["the 1.0 layout is refused naming both versions", "a file from before versioning reads as 1.0 and is refused"],
)
def test_the_1_x_layout_is_refused_naming_both(tmp_path: Path, raw: dict[str, Any]) -> None:
    with pytest.raises(InvalidConfigError) as err:
        load_config(_write(tmp_path, raw))
    assert "schemaVersion 1.0" in str(err.value) and f"reads {SCHEMA_VERSION}" in str(err.value)
    assert err.value.exit_code == EXIT_INVALID_CONFIG
