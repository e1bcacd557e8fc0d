"""How the trainer turns trainer.json's `training` section (the spec's own) into TRL's SFTConfig."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.spec import TrainingSpec
from finetune_operator.render import render_all
from finetune_trainer.arguments import build_sft_config, checkpointing_kwargs


def sft_config_of(**training: Any) -> Any:
    """The SFTConfig the trainer builds for the tiny CPU example with these spec.training fields."""
    body = yaml.safe_load(Path("examples/tiny-cpu.yaml").read_text())
    body["spec"]["training"].update(training)
    return build_sft_config(render_all(FineTuneJob.from_body(body)).trainer)


def test_offload_reaches_transformers_only_when_asked() -> None:
    assert checkpointing_kwargs(TrainingSpec(use_reentrant=False)) == {"use_reentrant": False}
    assert checkpointing_kwargs(TrainingSpec(use_reentrant=True, offload_activations=True)) == {
        "use_reentrant": True,
        "offload": True,
    }


def test_the_spec_field_reaches_the_trainer_arguments() -> None:
    """offloadActivations in the FineTuneJob -> trainer.json -> transformers' activation_checkpointing_kwargs."""
    args = sft_config_of(gradientCheckpointing=True, offloadActivations=True)
    assert args.activation_checkpointing is True
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False, "offload": True}


@pytest.mark.parametrize(
    ("training", "epochs", "max_steps"),
    [
        ({"maxSteps": 30}, 1.0, 30),
        ({"maxSteps": None, "epochs": 5}, 5.0, -1),
        ({"maxSteps": None}, 1.0, -1),
    ],
    ids=[
        "maxSteps alone: transformers stops there (one epoch is the unused default)",
        "epochs alone: no step limit",
        "neither: one epoch, not transformers' three",
    ],
)
def test_epochs_and_max_steps(training: dict[str, Any], epochs: float, max_steps: int) -> None:
    args = sft_config_of(**training)
    assert (args.num_train_epochs, args.max_steps) == (epochs, max_steps)


@pytest.mark.parametrize(
    ("training", "alpha"),
    [({}, None), ({"neftuneNoiseAlpha": 5.0}, 5.0)],
    ids=["NEFTune is off unless asked", "neftuneNoiseAlpha reaches SFTConfig's neftune_noise_alpha"],
)
def test_neftune_noise_alpha_reaches_the_trainer_arguments(training: dict[str, Any], alpha: float | None) -> None:
    assert sft_config_of(**training).neftune_noise_alpha == alpha


@pytest.mark.parametrize(("training", "warmup"), [({}, 0), ({"warmupSteps": 7}, 7), ({"warmupRatio": 0.25}, 0.25)])
def test_the_warmup_reaches_transformers_as_steps_or_a_ratio(training: dict[str, Any], warmup: float) -> None:
    """transformers 5 reads warmup_steps below 1 as a fraction of the run: warmupRatio goes there."""
    args = sft_config_of(**training)
    assert args.warmup_steps == warmup
    assert args.get_warmup_steps(40) == (10 if "warmupRatio" in training else warmup)
