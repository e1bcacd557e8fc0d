"""How the trainer turns the checkpointing fields of trainer.json into transformers' Trainer arguments."""

from pathlib import Path

import yaml

from finetune_api.trainer_input import TrainingConfig
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render import render_all
from finetune_trainer.arguments import build_sft_config, checkpointing_kwargs


def test_offload_reaches_transformers_only_when_asked() -> None:
    assert checkpointing_kwargs(TrainingConfig(use_reentrant=False)) == {"use_reentrant": False}
    assert checkpointing_kwargs(TrainingConfig(use_reentrant=True, offload_activations=True)) == {
        "use_reentrant": True,
        "offload": True,
    }


def test_the_spec_field_reaches_the_trainer_arguments() -> None:
    """offloadActivations in the FineTuneJob -> trainer.json -> transformers' activation_checkpointing_kwargs."""
    body = yaml.safe_load(Path("examples/tiny-cpu.yaml").read_text())
    body["spec"]["training"].update(gradientCheckpointing=True, offloadActivations=True)
    trainer = render_all(FineTuneJob.from_body(body)).trainer
    assert trainer.training.offload_activations is True
    args = build_sft_config(trainer)
    assert args.activation_checkpointing is True
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False, "offload": True}
