"""The files of a job's ConfigMap (accelerate.yaml, deepspeed.json, trainer.json, the progress CA), as text.

Serialized once, here, so every consumer gets the same bytes: the ConfigMap the operator applies, the directory
`ftjob render` writes and the one `ftjob run` reads. `render_files` is only the serialization (the benchmark
harness reserializes a trainer.json it amended); `render_config_files` is the renderer.
"""

import json
import re
from typing import Any

import yaml

from finetune_api import constants
from finetune_api.trainer_input import TrainerInput
from finetune_operator.render.accelerate import render_accelerate
from finetune_operator.render.context import RenderContext
from finetune_operator.render.deepspeed import render_deepspeed
from finetune_operator.render.trainer_config import render_trainer_input


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the files inside the ConfigMap) as readable `|` blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_BlockDumper, sort_keys=True, default_flow_style=False, width=120)


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def escape_astral(json_text: str) -> str:
    """Characters beyond U+FFFF (emoji) as JSON surrogate escapes: same JSON, and it survives the server-side
    apply of the ConfigMap, whose JSON-as-YAML body the apiserver's YAML decoder rejects with them escaped."""
    return _ASTRAL.sub(lambda m: json.dumps(m.group())[1:-1], json_text)


def render_files(
    accelerate: dict[str, Any], deepspeed: dict[str, Any] | None, trainer: TrainerInput
) -> dict[str, str]:
    """The three config files serialized (deepspeed.json only when DeepSpeed is on)."""
    files = {
        constants.ACCELERATE_FILE: dump_yaml(accelerate),
        constants.TRAINER_FILE: escape_astral(trainer.to_json()) + "\n",
    }
    if deepspeed is not None:
        files[constants.DEEPSPEED_FILE] = json.dumps(deepspeed, indent=2, sort_keys=True) + "\n"
    return files


def render_config_files(ctx: RenderContext) -> dict[str, str]:
    """Every file of the job's config directory, by name: the config files, and the CA the trainer pins for the
    progress URL when the options give one."""
    files = render_files(render_accelerate(ctx), render_deepspeed(ctx), render_trainer_input(ctx))
    if ctx.options.progress_ca_file is not None and ctx.options.progress_ca:
        files[constants.PROGRESS_CA_FILE] = ctx.options.progress_ca
    return files
