"""`trainer.json`: everything the trainer reads, rendered by the operator from a FineTuneJob.

Layout (schemaVersion 2): an envelope around the spec's own sections, resolved.

* `model`, `dataset`, `adapter`, `training` are the FineTuneJob API's models (`finetune_api.v1alpha1.spec`), in
  the API's camelCase, with every default filled in: what the user wrote is what the trainer reads, under the same
  names. `model` is `ModelSource` (spec.model without `tokenSecretRef`): tokens reach the trainer only through
  its environment (HF_TOKEN), never through this file.
* `output` is where the trainer writes in its pod (checkpoint and adapter directories) and the Hub target
  (`HubTarget`: spec.output.hub without `tokenSecretRef`); the volume behind the directories is the operator's.
* `strategy` is what the operator decided and the trainer must follow: machines and processes, the ZeRO stage
  (`zeroStage: auto` resolved by the planner), CPU or GPU, the dtype the base model is loaded in, and which decoder
  layers are checkpointed. `training.gradientCheckpointing` and `training.offloadActivations` arrive resolved too:
  `auto` never reaches the trainer (the planner's choice, `finetune_operator.plan`).
* `job` names the run, for the model card and the progress channel.

So a new training option is two edits: the field on the API model (`TrainingSpec`, with its description) and one
line in the trainer's translator (`finetune_trainer.arguments`), the only place where our names meet TRL's and
transformers'. Nothing copies the spec field by field.

This module imports only pydantic and the API models: the operator (no torch) builds it, the trainer (torch)
reads it.

Versioning. The file carries `schemaVersion` (`MAJOR.MINOR`) because the operator and the trainer image are
upgraded separately (users build their own trainer images): an operator one minor version ahead adds fields an
older trainer does not know, and that must not fail the job. `read_trainer_input` therefore drops fields it does
not know when the file's minor version is newer than its own (and says which, once), and refuses a different
major version with a message naming both. Within one version, unknown fields are still an error: they are typos.
Adding a field is a minor bump, and it is counted rather than written: the minor version is the number of fields
(`field_paths`) the layout has beyond those it had at `MAJOR.0`, so a new spec option bumps it without an edit
here. Renaming, removing or changing the meaning of a field is a major bump: raise `SCHEMA_MAJOR`, reset
`_FIELDS_AT_MAJOR` and re-record the baseline the versioning tests keep. 2.0 replaced 1.x's snake_case copy of the
spec (`data`, `lora`, `distributed`, TRL's names).
"""

import types
import typing
from typing import Any, Final

from pydantic import BaseModel, Field

from finetune_api.v1alpha1.base import ApiModel
from finetune_api.v1alpha1.spec import (
    AdapterSpec,
    DatasetSpec,
    Dtype,
    HubTarget,
    ModelSource,
    TrainingSpec,
)

SCHEMA_MAJOR: Final = 2
_FIELDS_AT_MAJOR: Final = 65
"""How many fields (`field_paths(TrainerInput)`) the layout had at SCHEMA_MAJOR.0; the versioning tests keep the list
(tests/golden/trainer-input/) and fail when one of them is gone."""
_UNVERSIONED: Final = "1.0"


class JobIdentity(ApiModel):
    """Who this run is, for the model card and the progress channel."""

    name: str = Field(description="The FineTuneJob's name.")
    namespace: str = Field(default="default", description="The FineTuneJob's namespace.")


class TrainerOutput(ApiModel):
    """Where the trainer writes, as paths inside its pod, and where it pushes."""

    checkpoint_dir: str = Field(description="Trainer checkpoints (the Trainer's output_dir), on the job's volume.")
    adapter_dir: str = Field(description="The final adapter and its model card.")
    hub: HubTarget | None = Field(default=None, description="Push target; the token comes from HF_TOKEN.")
    probe_path: str | None = Field(
        default=None,
        description=(
            "Test knob, never rendered by the operator: when set, the final model's logits on a fixed probe text "
            "are written here (safetensors: input_ids, logits), so a test can check that the saved adapter "
            "reproduces them."
        ),
    )


class RunStrategy(ApiModel):
    """What the operator decided from the spec and the memory plan; the launcher set up the processes to match."""

    num_machines: int = Field(default=1, ge=1, description="Pods (accelerate's num_machines).")
    num_processes: int = Field(default=1, ge=1, description="Processes across all pods (accelerate's num_processes).")
    zero_stage: int = Field(default=0, ge=0, le=3, description="ZeRO stage after `auto`; 0 is plain data parallel.")
    use_cpu: bool = Field(default=False, description="A CPU-only job (gpusPerNode: 0).")
    dtype: Dtype = Field(
        default="bfloat16",
        description=(
            "The dtype the base model is loaded in: the 4-bit storage dtype under QLoRA (so ZeRO-3 can shard it), "
            "else the one training.mixedPrecision computes in."
        ),
    )
    checkpointed_layers: int | None = Field(
        default=None,
        ge=1,
        description=(
            "With training.gradientCheckpointing: how many decoder layers are checkpointed, spread evenly from the "
            "first (the planner's choice: as few as the GPU needs); none checkpoints every layer."
        ),
    )


class TrainerInput(ApiModel):
    """The whole of trainer.json."""

    schema_version: str = Field(default_factory=lambda: SCHEMA_VERSION, pattern=r"^[0-9]+\.[0-9]+$")
    job: JobIdentity
    model: ModelSource
    dataset: DatasetSpec
    adapter: AdapterSpec = Field(default_factory=AdapterSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    output: TrainerOutput
    strategy: RunStrategy = Field(default_factory=RunStrategy)

    def to_json(self) -> str:
        """trainer.json's text: camelCase keys (as the API writes them), every field, nulls included."""
        return self.model_dump_json(indent=2, by_alias=True)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (`M`, `M | None`), or None for plain values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for m in map(_model_in, typing.get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


def field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field of `model` as a dotted camelCase path, nested models walked: what a layout is made of."""
    paths: list[str] = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        inner = _model_in(field.annotation)
        paths += field_paths(inner, f"{key}.") if inner else [key]
    return paths


SCHEMA_VERSION: Final[str] = f"{SCHEMA_MAJOR}.{len(field_paths(TrainerInput)) - _FIELDS_AT_MAJOR}"
"""The layout this package writes and reads: MAJOR.(fields added since MAJOR.0). A file without one is 1.0."""


class SchemaVersionError(ValueError):
    """trainer.json was written for an incompatible (different major) layout."""


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise SchemaVersionError(f"schemaVersion {text!r} is not MAJOR.MINOR")
    return int(major), int(minor)


def _drop_unknown(model: type[BaseModel], data: Any, path: str, dropped: list[str]) -> Any:
    """`data` without the keys `model` (recursively) does not know; their dotted paths go to `dropped`."""
    if not isinstance(data, dict):
        return data
    fields = {(f.alias or name): f for name, f in model.model_fields.items()} | dict(model.model_fields)
    kept: dict[str, Any] = {}
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            dropped.append(path + key)
            continue
        inner = _model_in(field.annotation)
        kept[key] = _drop_unknown(inner, value, f"{path}{key}.", dropped) if inner else value
    return kept


def read_trainer_input(raw: Any) -> tuple[TrainerInput, list[str]]:
    """Validate a parsed trainer.json: the input, and the fields dropped because a newer minor version wrote them.

    Raises `SchemaVersionError` for another major version, pydantic's `ValidationError` for anything else wrong.
    """
    written = raw.get("schemaVersion", _UNVERSIONED) if isinstance(raw, dict) else SCHEMA_VERSION
    (major, minor), (ours_major, ours_minor) = _version(str(written)), _version(SCHEMA_VERSION)
    if major != ours_major:
        raise SchemaVersionError(
            f"trainer.json has schemaVersion {written}, this trainer reads {SCHEMA_VERSION} "
            f"(major versions differ): use a trainer image that matches the operator"
        )
    dropped: list[str] = []
    if minor > ours_minor:
        raw = _drop_unknown(TrainerInput, raw, "", dropped)
    return TrainerInput.model_validate(raw), dropped
