"""finetune-operator: FineTuneJob custom resources turned into multi-node TRL + PEFT training runs."""

__version__ = "0.1.0"
