"""Session fixtures for the trainer tests (defined in launching.py, next to the helpers they use)."""

from tests.trainer.launching import trainer_env, zero3_run

__all__ = ["trainer_env", "zero3_run"]
