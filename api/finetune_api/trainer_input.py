"""`trainer.json`: everything the trainer reads, rendered by the operator from a FineTuneJob.

Field names follow TRL / transformers / PEFT (snake_case), so the trainer is a thin translation.
This module imports only pydantic: the operator (no torch) builds it, the trainer (torch) reads it.

Defaults that differ from TRL's `SFTConfig`: `gradient_checkpointing` stays as the spec says (TRL: True),
`bf16` follows `mixed_precision` (TRL: True unless fp16), `learning_rate` 1e-4 (TRL: 2e-5),
`logging_steps` 5 (TRL: 10), `save_total_limit` 2 (transformers: unlimited).

Versioning. The file carries `schemaVersion` (`MAJOR.MINOR`) because the operator and the trainer image are
upgraded separately (users build their own trainer images): an operator one minor version ahead adds fields an
older trainer does not know, and that must not fail the job. `read_trainer_input` therefore drops fields it does
not know when the file's minor version is newer than its own (and says which, once), and refuses a different
major version with a message naming both. Within one version, unknown fields are still an error: they are typos.
Adding a field is a minor bump; renaming, removing or changing the meaning of one is a major bump.
"""

import types
import typing
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

Dtype = Literal["bfloat16", "float16", "float32"]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QuantizationConfig(_Config):
    """bitsandbytes 4-bit; the model is loaded in `storage_dtype` so ZeRO-3 can shard it."""

    quant_type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    compute_dtype: Dtype = "bfloat16"
    storage_dtype: Dtype = "bfloat16"


class ModelConfig(_Config):
    """The base model."""

    name_or_path: str
    revision: str = "main"
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    dtype: Dtype = "bfloat16"
    quantization: QuantizationConfig | None = None
    trust_remote_code: bool = False


class DataConfig(_Config):
    """Dataset and tokenization."""

    name_or_path: str
    splits: list[str] = Field(default_factory=lambda: ["train", "test"])
    text_field: str = "content"
    chat_template_format: Literal["chatml", "zephyr", "none"] = "none"
    add_special_tokens: bool = False
    append_concat_token: bool = False
    max_seq_len: int = 2048
    packing: bool = True


class LoraConfig(_Config):
    """PEFT LoRA."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.1
    target_modules: str | list[str] = "all-linear"


class TrainingConfig(_Config):
    """Hyper-parameters, named as in transformers' TrainingArguments."""

    num_train_epochs: float = 1.0
    max_steps: int = -1
    learning_rate: float = 1e-4
    lr_scheduler_type: str = "cosine"
    weight_decay: float = 1e-4
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = True
    use_reentrant: bool = False
    offload_activations: bool = False
    mixed_precision: Literal["no", "fp16", "bf16"] = "bf16"
    seed: int = 100
    logging_steps: int = 5
    eval_strategy: Literal["no", "steps", "epoch"] = "epoch"
    eval_steps: int | None = None
    save_strategy: Literal["no", "steps", "epoch"] = "epoch"
    save_steps: int | None = None
    save_total_limit: int | None = 2
    merge_adapter: bool = False
    full_determinism: bool = False
    """Added for the trainer: transformers' `full_determinism` (deterministic kernels; slower on GPU).
    CPU runs are already reproducible with `seed`; the resume tests do not need it."""


class HubConfig(_Config):
    """Push target; the token comes from the HF_TOKEN environment variable, never from this file."""

    repo_id: str
    private: bool = True
    strategy: Literal["end", "every_save", "checkpoint", "all_checkpoints"] = "every_save"
    endpoint: str | None = None


class OutputConfig(_Config):
    """Where checkpoints and the final adapter are written."""

    checkpoint_dir: str = "/checkpoints"
    adapter_dir: str = "/checkpoints/adapter"
    hub: HubConfig | None = None
    probe_path: str | None = None
    """Added for the trainer: when set, the final model's logits on a fixed probe text are written here
    (safetensors: `input_ids`, `logits`), so a test can check that the saved adapter reproduces them."""


class DistributedConfig(_Config):
    """What the launcher set up; the trainer only reads it to log and to pick per-stage workarounds."""

    num_machines: int = 1
    num_processes: int = 1
    zero_stage: int = Field(default=0, ge=0, le=3)
    use_cpu: bool = False


class JobInfo(_Config):
    """Who this run is, for the model card and the progress channel."""

    name: str
    namespace: str = "default"


SCHEMA_VERSION: Final = "1.0"
"""The layout this package writes and reads; a trainer.json without `schemaVersion` is 1.0."""


class TrainerConfig(_Config):
    """The whole of trainer.json."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    schema_version: str = Field(default=SCHEMA_VERSION, alias="schemaVersion", pattern=r"^[0-9]+\.[0-9]+$")
    job: JobInfo
    model: ModelConfig
    data: DataConfig
    lora: LoraConfig | None = Field(default_factory=LoraConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)


class SchemaVersionError(ValueError):
    """trainer.json was written for an incompatible (different major) layout."""


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise SchemaVersionError(f"schemaVersion {text!r} is not MAJOR.MINOR")
    return int(major), int(minor)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (`M`, `M | None`), or None for plain values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for m in map(_model_in, typing.get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


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


def read_trainer_input(raw: Any) -> tuple[TrainerConfig, list[str]]:
    """Validate a parsed trainer.json: the config, and the fields dropped because a newer minor version wrote them.

    Raises `SchemaVersionError` for another major version, pydantic's `ValidationError` for anything else wrong.
    """
    written = raw.get("schemaVersion", "1.0") if isinstance(raw, dict) else SCHEMA_VERSION
    (major, minor), (ours_major, ours_minor) = _version(str(written)), _version(SCHEMA_VERSION)
    if major != ours_major:
        raise SchemaVersionError(
            f"trainer.json has schemaVersion {written}, this trainer reads {SCHEMA_VERSION} "
            f"(major versions differ): use a trainer image that matches the operator"
        )
    dropped: list[str] = []
    if minor > ours_minor:
        raw = _drop_unknown(TrainerConfig, raw, "", dropped)
    return TrainerConfig.model_validate(raw), dropped
