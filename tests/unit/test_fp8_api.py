"""`training.precision: fp8` outside the trainer: it reaches trainer.json, the planner's `zeroStage: auto` never
picks ZeRO-3 for it, and `ftjob run` on a machine without GPUs refuses it up front (the rules themselves, CEL and
Python, are tested with the others in test_rules.py)."""

from typing import Any

import pytest

from finetune_api.v1alpha1.errors import FieldError, InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.spec import FP8_NEEDS_GPUS
from finetune_operator.local import fit_to_machine
from finetune_operator.plan import FP8_NOT_ZERO3, Strategy, plan_job
from finetune_operator.render import render_all
from finetune_operator.validation import check_job
from tests.builders import with_spec


def _fp8(**kwargs: Any) -> FineTuneJob:
    return FineTuneJob.from_body(with_spec("training.precision", "fp8", **kwargs))


def test_precision_defaults_to_default_and_fp8_reaches_trainer_json() -> None:
    assert FineTuneJob.from_body(with_spec("training.epochs", 1)).spec.training.precision == "default"
    trainer = render_all(_fp8(zero=2)).trainer
    assert trainer.training.precision == "fp8" and trainer.strategy.zero_stage == 2
    assert '"precision": "fp8"' in render_all(_fp8(zero=2)).files["trainer.json"]


def test_auto_picks_the_same_low_stage_for_fp8_when_it_fits() -> None:
    spec = _fp8(model="meta-llama/Meta-Llama-3-8B", zero="auto").spec
    assert plan_job(spec).strategy == Strategy(0)


def test_auto_never_picks_zero3_for_fp8_and_says_why() -> None:
    """70B bf16 on 8 GPUs needs ZeRO-3 (test_plan.py); under fp8 `auto` has nothing left and says so."""
    bf16 = FineTuneJob.from_body(
        with_spec("training.precision", "default", model="meta-llama/Llama-2-70b-hf", zero="auto")
    )
    assert plan_job(bf16.spec).strategy.zero_stage == 3
    with pytest.raises(InvalidSpecError) as caught:
        plan_job(_fp8(model="meta-llama/Llama-2-70b-hf", zero="auto").spec)
    [error] = caught.value.errors
    assert error.path == "spec.distributed" and error.message.count(FP8_NOT_ZERO3) == 1
    assert "stage 2/none" in error.message  # the stages it could use were tried and did not fit


def test_ftjob_run_without_gpus_refuses_fp8_before_starting_anything() -> None:
    """`ftjob run` turns a GPU job into a CPU one on a machine without GPUs; the fp8 rule then refuses it."""
    fitted, notes = fit_to_machine(_fp8(zero=0), nodes=None, gpus_here=0)
    assert notes and fitted.spec.distributed.gpus_per_node == 0
    assert check_job(fitted) == [FieldError("spec.training.precision", FP8_NEEDS_GPUS)]
