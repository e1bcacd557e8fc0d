"""The trainer refuses the transformers versions that keep every ZeRO-3-gathered layer on the GPU."""

import pytest

from finetune_trainer.compat import zero3_checkpointing_problem


@pytest.mark.parametrize("version", ["5.17.0", "5.23.1", "4.57.1", "5.9.0.dev0"])
def test_old_transformers_is_refused_under_zero3_with_checkpointing(version: str) -> None:
    problem = zero3_checkpointing_problem(version, zero3=True, checkpointing=True)
    assert problem is not None and version in problem and ">= 5.24" in problem


@pytest.mark.parametrize(
    ("version", "zero3", "checkpointing"),
    [("5.24.0", True, True), ("5.30.0.dev0", True, True), ("6.0.0", True, True), ("5.17.0", False, True),
     ("5.17.0", True, False)],
)
def test_fixed_versions_and_other_setups_pass(version: str, zero3: bool, checkpointing: bool) -> None:
    assert zero3_checkpointing_problem(version, zero3=zero3, checkpointing=checkpointing) is None
