"""trainer.json's schemaVersion: a newer minor is read with a warning, another major is refused (exit 64).

The operator and the trainer image are upgraded separately, so a trainer must read what a newer operator of the
same major version writes. Cases: the layout written today, one from a newer minor version (unknown fields at
the top and nested), an unknown field at today's version (a typo: still an error), a newer major version, and a
file from before versioning (no schemaVersion).
"""

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.constants import EXIT_INVALID_CONFIG
from finetune_api.trainer_input import SCHEMA_VERSION, TrainerConfig
from finetune_api.v1alpha1 import FineTuneJob
from finetune_operator.render import render_all
from finetune_trainer.errors import InvalidConfigError
from finetune_trainer.loading import load_config


def _written_today() -> dict[str, Any]:
    body = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml").read_text())
    trainer = render_all(FineTuneJob.from_body(body)).trainer
    raw: dict[str, Any] = json.loads(trainer.model_dump_json())
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
    assert cfg == TrainerConfig.model_validate(raw)
    assert caplog.records == []


def test_a_newer_minor_version_drops_unknown_fields_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    major = SCHEMA_VERSION.split(".")[0]
    raw = _written_today() | {"schemaVersion": f"{major}.99", "curriculum": {"stages": 3}}
    raw["training"] = raw["training"] | {"fancy_new_option": True}
    with caplog.at_level(logging.WARNING):
        cfg = load_config(_write(tmp_path, raw))
    assert cfg.training == TrainerConfig.model_validate(_written_today()).training
    assert cfg.schema_version == f"{major}.99"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "curriculum" in warnings[0] and "training.fancy_new_option" in warnings[0]
    assert f"{major}.99" in warnings[0] and SCHEMA_VERSION in warnings[0]


def test_an_unknown_field_at_this_version_is_still_an_error(tmp_path: Path) -> None:
    raw = _written_today()
    raw["training"] = raw["training"] | {"learning_rat": 1e-3}
    with pytest.raises(InvalidConfigError, match=r"training\.learning_rat") as err:
        load_config(_write(tmp_path, raw))
    assert err.value.exit_code == EXIT_INVALID_CONFIG


def test_another_major_version_is_refused_naming_both(tmp_path: Path) -> None:
    newer = f"{int(SCHEMA_VERSION.split('.')[0]) + 1}.0"
    with pytest.raises(InvalidConfigError) as err:
        load_config(_write(tmp_path, _written_today() | {"schemaVersion": newer}))
    assert newer in str(err.value) and SCHEMA_VERSION in str(err.value)
    assert err.value.exit_code == EXIT_INVALID_CONFIG


def test_a_file_from_before_versioning_reads_as_1_0(tmp_path: Path) -> None:
    raw = _written_today()
    del raw["schemaVersion"]
    assert load_config(_write(tmp_path, raw)).schema_version == SCHEMA_VERSION == "1.0"
