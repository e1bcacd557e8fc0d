"""Which checkpoint a restart resumes from: only ones with a completion marker; torn ones are set aside."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_trainer.checkpoints import MARKER, newest_complete, set_aside_torn, write_marker

pytestmark = pytest.mark.trainer


def make(root: Path, step: int, *, complete: bool) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"x")
    if complete:
        write_marker(path, step)
    return path


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ({}, None),
        ({4: True}, 4),
        ({4: True, 8: True}, 8),
        ({4: True, 8: False}, 4),
        ({4: False}, None),
        ({10: True, 9: True, 100: False}, 10),
    ],
    ids=[
        "no checkpoint means a fresh start",
        "a single complete checkpoint is resumed",
        "the newest complete checkpoint wins",
        "a torn newer checkpoint is skipped",
        "only torn checkpoints means a fresh start",
        "steps compare as numbers, not strings",
    ],
)
def test_newest_complete(tmp_path: Path, layout: dict[int, bool], expected: int | None) -> None:
    for step, complete in layout.items():
        make(tmp_path, step, complete=complete)
    found = newest_complete(tmp_path)
    assert (int(found.name.split("-")[1]) if found else None) == expected


def test_torn_checkpoints_are_moved_out_of_the_trainers_glob(tmp_path: Path) -> None:
    make(tmp_path, 4, complete=True)
    make(tmp_path, 8, complete=False)
    moved = set_aside_torn(tmp_path)
    assert [p.name.startswith("torn-checkpoint-8-") for p in moved] == [True]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-4"]
    assert (tmp_path / "checkpoint-4" / MARKER).is_file()
