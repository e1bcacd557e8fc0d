"""Read trainer.json into `TrainerConfig`; any problem is `InvalidConfigError` (exit 64) naming the field."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from finetune_api.trainer_input import TrainerConfig
from finetune_trainer.errors import InvalidConfigError


def load_config(path: str | Path) -> TrainerConfig:
    """Parse and validate; every invalid field is listed as `dotted.path: message`."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise InvalidConfigError(f"{path}: cannot read trainer config: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise InvalidConfigError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from e
    try:
        return TrainerConfig.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors())
        raise InvalidConfigError(f"{path}: invalid trainer config: {problems}") from e
