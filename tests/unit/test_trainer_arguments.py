"""How the trainer turns the checkpointing fields of trainer.json into transformers' Trainer arguments."""

from finetune_trainer.arguments import checkpointing_kwargs
from finetune_trainer.config import TrainingConfig


def test_offload_reaches_transformers_only_when_asked() -> None:
    assert checkpointing_kwargs(TrainingConfig(use_reentrant=False)) == {"use_reentrant": False}
    assert checkpointing_kwargs(TrainingConfig(use_reentrant=True, offload_activations=True)) == {
        "use_reentrant": True,
        "offload": True,
    }
