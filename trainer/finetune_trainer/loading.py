"""Read trainer.json into `TrainerInput`; any problem is `InvalidConfigError` (exit 64) naming the field.

A file from a newer minor schema version (a newer operator) loses the fields this trainer does not know, with
one warning naming them; another major version is refused (`finetune_api.trainer_input.read_trainer_input`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import ValidationError

from finetune_api.trainer_input import SCHEMA_VERSION, SchemaVersionError, TrainerInput, read_trainer_input
from finetune_trainer.errors import InvalidConfigError

log = logging.getLogger(__name__)


def load_config(path: str | Path) -> TrainerInput:
    """Parse and validate; every invalid field is listed as `dotted.path: message`."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise InvalidConfigError(f"{path}: cannot read trainer config: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise InvalidConfigError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from e
    try:
        cfg, dropped = read_trainer_input(raw)
    except SchemaVersionError as e:
        raise InvalidConfigError(f"{path}: {e}") from e
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors())
        raise InvalidConfigError(f"{path}: invalid trainer config: {problems}") from e
    if dropped:
        log.warning(
            "%s: written for schemaVersion %s, this trainer reads %s: ignoring fields it does not know: %s",
            path,
            cfg.schema_version,
            SCHEMA_VERSION,
            ", ".join(dropped),
        )
    return cfg
