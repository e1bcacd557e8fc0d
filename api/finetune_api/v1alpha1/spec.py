"""FineTuneJob spec (v1alpha1). Field names follow the seed recipe's flags, in camelCase.

Every field's description is `kubectl explain` text and states the default. Defaults live here, in
the model, not in the CRD schema: API-server defaulting would rewrite stored objects. Rules between
fields that CEL can say sit in the object they guard, each as one entry of its rule table
(`finetune_api.v1alpha1.rules`): the CEL the CRD carries and the Python `check_job` runs, side by side,
with one path and one message. A CEL expression reads the object as written, so it reads an absent field
as the default the model gives it.
"""

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, ValidationInfo, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

from finetune_api import constants
from finetune_api.v1alpha1.base import ApiModel
from finetune_api.v1alpha1.rules import ValueRule, rule, transition_rule

Dtype = Literal["bfloat16", "float16", "float32"]
OffloadDevice = Literal["none", "cpu", "nvme"]
ZeroStage = Annotated[
    Literal[0, 1, 2, 3, "auto"],
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
    ValueRule(
        "type(self) == string ? self == 'auto' : (self >= 0 && self <= 3)",
        lambda stage: stage == "auto" if isinstance(stage, str) else type(stage) is int and 0 <= stage <= 3,
        "zeroStage must be 0, 1, 2, 3 or 'auto'",
    ),
]
Quantity = Annotated[str | int, WithJsonSchema({"x-kubernetes-int-or-string": True})]


def _boolean_or_auto(value: Any) -> Any:
    """One error at the field's path (not one per union branch) for anything but true, false and 'auto'."""
    if not (isinstance(value, bool) or value == "auto"):
        raise PydanticCustomError("api_rule", "gradientCheckpointing must be true, false or 'auto'")
    return value


Checkpointing = Annotated[
    StrictBool | Literal["auto"],
    # a boolean or the string 'auto': no structural schema types a union, so the CRD keeps any value here and the
    # model refuses anything else (InvalidSpec in status). CEL cannot see a field without a type either (the API
    # server refuses a CRD whose rules name it), so the rules that read it are the model's alone.
    WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True}),
    BeforeValidator(_boolean_or_auto),
]
OFFLOAD_NEEDS_CHECKPOINTING = (
    "training.offloadActivations needs gradientCheckpointing: true (only checkpoints are offloaded)"
)
FP8_NEEDS_BF16 = "training.precision: fp8 needs mixedPrecision: bf16 (everything but the base's matmuls runs in bf16)"
FP8_NO_MERGE = (
    "training.precision: fp8 cannot merge the adapter (mergeAdapter: true): the trainer keeps only FP8 copies of "
    "the base weights; merge the saved adapter into the bf16 base separately"
)
FP8_NO_QUANTIZATION = (
    "training.precision: fp8 is not combinable with model.quantization: a 4-bit base has no bf16 weights to put in "
    "FP8; remove one of them"
)
FP8_NO_ZERO3 = (
    "training.precision: fp8 needs distributed.deepspeed.zeroStage 0, 1, 2 or auto (ZeRO-3, the default, shards "
    "the base weights that fp8 replaces with FP8 copies)"
)
FP8_NEEDS_GPUS = (
    "training.precision: fp8 needs GPUs with FP8 matmuls (distributed.gpusPerNode > 0; compute capability 8.9 or "
    "newer: Ada, Hopper, Blackwell): CPUs have none"
)
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


class SecretKeyRef(ApiModel):
    """A key of a Secret in the job's namespace. Tokens only ever travel this way."""

    name: str = Field(min_length=1, max_length=253, description="Secret name.")
    key: str = Field(default="token", min_length=1, max_length=253, description="Key in the Secret. Default: token.")


class Quantization(ApiModel):
    """bitsandbytes 4-bit (QLoRA). Present means the base model is loaded in 4 bit."""

    quant_type: Literal["nf4", "fp4"] = Field(default="nf4", description="bnb_4bit_quant_type. Default: nf4.")
    double_quant: bool = Field(
        default=True, description="bnb_4bit_use_double_quant (the seed's use_nested_quant). Default: true."
    )
    compute_dtype: Dtype = Field(default="bfloat16", description="bnb_4bit_compute_dtype. Default: bfloat16.")
    storage_dtype: Dtype = Field(
        default="bfloat16",
        description=(
            "bnb_4bit_quant_storage. The model dtype follows it, which is what lets DeepSpeed ZeRO-3 shard "
            "the 4-bit weights. Default: bfloat16."
        ),
    )


class ModelShape(ApiModel):
    """Architecture numbers the memory planner needs when it cannot know the model by name."""

    num_parameters: int = Field(gt=0, description="Total parameters of the base model.")
    hidden_size: int = Field(gt=0, description="Hidden size.")
    num_layers: int = Field(gt=0, description="Number of transformer layers.")
    intermediate_size: int | None = Field(default=None, gt=0, description="MLP width. Default: 3.5 x hidden.")
    vocab_size: int = Field(default=32000, gt=0, description="Vocabulary size. Default: 32000.")
    num_attention_heads: int | None = Field(default=None, gt=0, description="Attention heads.")
    num_key_value_heads: int | None = Field(default=None, gt=0, description="KV heads (GQA). Default: heads.")


class ModelSource(ApiModel):
    """The base model as the trainer loads it: `spec.model` without the token's Secret (trainer.json's `model`)."""

    name: str = Field(min_length=1, max_length=512, description="Hub id (org/name) or a path in the image or volume.")
    revision: str = Field(default="main", max_length=256, description="Hub revision. Default: main.")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        default="sdpa",
        description="Attention kernel; falls back to sdpa with a log line where flash-attn is missing. Default: sdpa.",
    )
    quantization: Quantization | None = Field(default=None, description="Present => QLoRA (4-bit base model).")
    shape: ModelShape | None = Field(
        default=None, description="Architecture for the memory planner; known model names need none."
    )
    trust_remote_code: bool = Field(default=False, description="Allow model code from the Hub. Default: false.")


class ModelSpec(ModelSource):
    """The base model to fine-tune."""

    token_secret_ref: SecretKeyRef | None = Field(default=None, description="HF token for gated or private models.")


class DatasetSpec(ApiModel):
    """Training data: a Hub dataset or local jsonl / parquet / arrow files."""

    name: str = Field(min_length=1, max_length=512, description="Hub id or local path (file or directory).")
    splits: list[str] = Field(
        default_factory=lambda: ["train", "test"],
        min_length=1,
        max_length=2,
        description="Train split, then an optional eval split. Default: [train, test].",
    )
    text_field: str = Field(
        default="content", min_length=1, max_length=128, description="Column holding text or chat messages."
    )
    chat_template_format: Literal["chatml", "zephyr", "none"] = Field(
        default="none", description="Chat template applied to message lists. Default: none."
    )
    add_special_tokens: bool = Field(default=False, description="Add special tokens when tokenizing. Default: false.")
    append_concat_token: bool = Field(default=False, description="Append EOS between packed documents. Default: false.")
    max_seq_len: int = Field(default=2048, ge=16, le=1_048_576, description="Max tokens per sequence. Default: 2048.")
    packing: bool = Field(
        default=True,
        description="Pack documents into full sequences without cross-document attention. Default: true.",
    )


class AdapterSpec(ApiModel):
    """PEFT LoRA adapter."""

    type: Literal["lora"] = Field(default="lora", description="Adapter kind. Default: lora.")
    r: int = Field(default=8, ge=1, le=4096, description="LoRA rank. Default: 8.")
    alpha: int = Field(default=16, ge=1, le=65536, description="LoRA alpha. Default: 16.")
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0, description="LoRA dropout. Default: 0.1.")
    target_modules: str | list[str] = Field(
        default="all-linear",
        description="'all-linear' or a list of module names (q_proj, v_proj, ...). Default: all-linear.",
    )


class TrainingSpec(ApiModel):
    """Hyper-parameters: the seed's launch flags."""

    @rule(
        ".warmupRatio",
        "!has(self.warmupRatio) || !has(self.warmupSteps) || self.warmupSteps == 0",
        "training.warmupRatio and warmupSteps both set the warm-up: set one of them",
    )
    def one_warmup_length(self) -> bool:
        return self.warmup_ratio is None or self.warmup_steps == 0

    epochs: float | None = Field(default=None, gt=0, description="num_train_epochs. Default: 1 unless maxSteps.")
    max_steps: int | None = Field(default=None, gt=0, description="Stop after this many optimizer steps.")
    learning_rate: float = Field(default=1e-4, gt=0, description="Default: 1e-4.")
    lr_scheduler_type: Literal[
        "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"
    ] = Field(default="cosine", description="Default: cosine.")
    weight_decay: float = Field(default=1e-4, ge=0, description="Default: 1e-4.")
    warmup_steps: int = Field(default=0, ge=0, description="Default: 0.")
    warmup_ratio: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="Warm the learning rate up over this fraction of the optimizer steps, instead of warmupSteps "
        "(e.g. 0.03). Default: none.",
    )
    max_grad_norm: float = Field(default=1.0, ge=0, description="Gradient clipping. Default: 1.0.")
    neftune_noise_alpha: float | None = Field(
        default=None,
        gt=0,
        description="NEFTune: uniform noise of scale alpha / sqrt(sequence length x hidden size) added to the input "
        "embeddings while training (the paper used 5 to 15). Default: off.",
    )
    per_device_train_batch_size: int = Field(default=8, ge=1, le=65536, description="Default: 8.")
    per_device_eval_batch_size: int = Field(default=8, ge=1, le=65536, description="Default: 8.")
    gradient_accumulation_steps: int = Field(default=1, ge=1, le=65536, description="Default: 1.")
    gradient_checkpointing: Checkpointing = Field(
        default="auto",
        description="Activation checkpointing: true, false or auto. auto: the memory planner turns it off when the "
        "training step fits the GPU with headroom (fastest), else checkpoints only as many decoder layers as needed, "
        "all of them when it must, and with offloadActivations' host copy as the last step; status.plan says what it "
        "chose and why. Default: auto.",
    )
    use_reentrant: bool = Field(
        default=False,
        description="Reentrant checkpointing. TRL forces true under PEFT + ZeRO-3. Default: false.",
    )
    offload_activations: bool = Field(
        default=False,
        description="Hold the checkpointed activations (layers x tokens x hidden) in pinned host memory instead of "
        "on the GPU: less GPU memory for a host copy each way per step. Needs gradientCheckpointing. Default: false.",
    )

    @field_validator("offload_activations")
    @classmethod
    def offloaded_activations_are_checkpoints(cls, offload: bool, info: ValidationInfo) -> bool:
        """Only checkpoints are offloaded. The model's rule alone: CEL cannot read gradientCheckpointing (untyped)."""
        if offload and info.data.get("gradient_checkpointing", "auto") is False:
            raise PydanticCustomError("api_rule", OFFLOAD_NEEDS_CHECKPOINTING)
        return offload

    mixed_precision: Literal["no", "fp16", "bf16"] = Field(default="bf16", description="Default: bf16.")
    seed: int = Field(default=100, ge=0, description="Default: 100.")
    logging_steps: int = Field(default=5, ge=1, description="Default: 5.")
    eval_strategy: Literal["no", "steps", "epoch"] = Field(default="epoch", description="Default: epoch.")
    eval_steps: int | None = Field(default=None, ge=1, description="With evalStrategy: steps.")
    save_strategy: Literal["no", "steps", "epoch"] = Field(default="epoch", description="Default: epoch.")
    save_steps: int | None = Field(default=None, ge=1, description="With saveStrategy: steps.")
    save_total_limit: int | None = Field(default=2, ge=1, description="Checkpoints kept on the volume. Default: 2.")
    merge_adapter: bool = Field(
        default=False, description="Also save the base model with the adapter merged in. Default: false."
    )
    precision: Literal["default", "fp8"] = Field(
        default="default",
        description="Matmul precision of the frozen base model. default: mixedPrecision's dtype. fp8: the decoder "
        "layers' linear layers of the base run FP8 (e4m3) matmuls with row-wise scales, forward and input gradient; "
        "the adapter, norms, attention, embeddings, lm_head and the loss stay bf16. Faster, with a loss a little "
        "off bf16's. Needs GPUs of compute capability 8.9 or newer (Ada, Hopper, Blackwell), mixedPrecision: bf16, "
        "zeroStage 0, 1, 2 or auto (not 3), no model.quantization and no mergeAdapter. Default: default.",
    )

    @rule(
        ".precision",
        "!has(self.precision) || self.precision != 'fp8' || !has(self.mixedPrecision) || self.mixedPrecision == 'bf16'",
        FP8_NEEDS_BF16,
    )
    def fp8_computes_in_bf16(self) -> bool:
        return self.precision != "fp8" or self.mixed_precision == "bf16"

    @rule(
        ".precision",
        "!has(self.precision) || self.precision != 'fp8' || !has(self.mergeAdapter) || !self.mergeAdapter",
        FP8_NO_MERGE,
    )
    def fp8_does_not_merge(self) -> bool:
        return self.precision != "fp8" or not self.merge_adapter


class DeepSpeedSpec(ApiModel):
    """DeepSpeed ZeRO. Stage 0 means DeepSpeed off: plain data parallel."""

    zero_stage: ZeroStage = Field(
        default=3,
        description="0 | 1 | 2 | 3 | auto (the memory planner picks the lowest that fits). Default: 3.",
    )
    offload_optimizer: OffloadDevice = Field(
        default="none",
        description="Optimizer state offload: none | cpu | nvme (needs zeroStage >= 1). Default: none.",
    )
    offload_params: OffloadDevice = Field(
        default="none", description="Parameter offload: none | cpu | nvme (zeroStage 3 only). Default: none."
    )
    nvme_path: str | None = Field(default=None, max_length=1024, description="Local NVMe mount for nvme offload.")
    zero3_init: bool = Field(default=True, description="Build the model under deepspeed.zero.Init. Default: true.")
    save16bit_model: bool = Field(
        default=True,
        alias="save16bitModel",
        description="Gather 16-bit weights on save (stage3_gather_16bit_weights_on_model_save). Default: true.",
    )
    overrides: FreeForm = Field(
        default_factory=dict, description="Raw DeepSpeed JSON merged last, for experts. Default: {}."
    )


class RendezvousSpec(ApiModel):
    """torch elastic rendezvous between the node pods."""

    backend: Literal["c10d", "static"] = Field(default="c10d", description="Default: c10d.")
    port: int = Field(default=29500, ge=1024, le=65535, description="Default: 29500.")
    timeout_seconds: int = Field(default=900, ge=10, le=86400, description="Default: 900.")
    max_restarts: int = Field(
        default=3, ge=0, le=100, description="In-pod worker restarts by torch elastic. Default: 3."
    )


class DistributedSpec(ApiModel):
    """How many machines and GPUs, and how the model is sharded across them."""

    @rule(
        ".processesPerNode",
        "!has(self.gpusPerNode) || self.gpusPerNode > 0 || has(self.processesPerNode)",
        "processesPerNode must be set when gpusPerNode is 0 (CPU-only job)",
        reason="FieldValueRequired",
    )
    def cpu_jobs_count_their_processes(self) -> bool:
        return self.gpus_per_node > 0 or self.processes_per_node is not None

    nodes: int = Field(default=1, ge=1, le=512, description="Pods (machines). Default: 1.")
    gpus_per_node: int = Field(default=8, ge=0, le=16, description="GPUs per pod; 0 runs on CPU. Default: 8.")
    processes_per_node: int | None = Field(
        default=None, ge=1, le=64, description="Training processes per pod. Default: gpusPerNode."
    )
    gpu_memory_gi_b: float = Field(
        default=80.0,
        alias="gpuMemoryGiB",
        gt=0,
        le=4096,
        description="Memory of one GPU, for the planner (zeroStage: auto and status.plan). Default: 80.",
    )
    deepspeed: DeepSpeedSpec = Field(default_factory=DeepSpeedSpec, description="DeepSpeed ZeRO settings.")
    rendezvous: RendezvousSpec = Field(default_factory=RendezvousSpec, description="Rendezvous settings.")


class HubTarget(ApiModel):
    """Where the trained adapter is pushed, as the trainer reads it: `spec.output.hub` without the token's Secret."""

    repo_id: str = Field(
        min_length=3,
        max_length=200,
        pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$",
        description="org/name on the Hub.",
    )
    private: bool = Field(default=True, description="Create the repo private. Default: true.")
    strategy: Literal["end", "every_save", "checkpoint", "all_checkpoints"] = Field(
        default="every_save", description="hub_strategy. Default: every_save."
    )
    endpoint: str | None = Field(default=None, max_length=512, description="Hub endpoint. Default: huggingface.co.")


class HubOutput(HubTarget):
    """Where the trained adapter is pushed."""

    token_secret_ref: SecretKeyRef = Field(description="Secret holding a write token.")


class CheckpointVolume(ApiModel):
    """The volume checkpoints live on; a PVC survives node loss, an emptyDir does not."""

    persistent_volume_claim: FreeForm | None = Field(default=None, description="A PVC source ({claimName}).")
    empty_dir: FreeForm | None = Field(default=None, description="An emptyDir source (throw-away runs).")


class OutputSpec(ApiModel):
    """Where results go."""

    hub: HubOutput | None = Field(default=None, description="Push the adapter to the Hub.")
    checkpoints: CheckpointVolume = Field(
        default_factory=lambda: CheckpointVolume(empty_dir={}),
        description="Checkpoint volume. Default: an emptyDir (no resume after a lost node).",
    )


class RunPolicy(ApiModel):
    """Lifecycle knobs; the only part of a running spec that may change."""

    backoff_limit: int = Field(default=3, ge=0, le=100, description="Attempts after the first. Default: 3.")
    active_deadline_seconds: int | None = Field(default=None, ge=1, description="Fail after this long running.")
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Delete the job this long after it finished."
    )
    suspend: bool = Field(default=False, description="Stop the pods (checkpoints are kept). Default: false.")


def _reserved_label(key: str) -> str:
    """CEL: `key` is a label key the operator or the Job controller sets (constants.RESERVED_LABEL_*)."""
    prefixes = [f"{key}.startsWith('{p}')" for p in constants.RESERVED_LABEL_PREFIXES]
    exact = ", ".join(f"'{k}'" for k in constants.RESERVED_LABEL_KEYS)
    return "(" + " || ".join([*prefixes, f"{key} in [{exact}]"]) + ")"


def reserved_label(key: str) -> bool:
    """`key` is a label key the operator or the Job controller sets: `_reserved_label`'s CEL, in Python."""
    return key.startswith(constants.RESERVED_LABEL_PREFIXES) or key in constants.RESERVED_LABEL_KEYS


RESERVED_LABELS_MESSAGE = (
    f"label keys under {' or '.join(constants.RESERVED_LABEL_PREFIXES)} and the keys "
    f"{', '.join(constants.RESERVED_LABEL_KEYS)} are reserved for the operator and the Job controller"
)
"""`spec.template.labels`: the message of `PodTemplate.labels_leave_reserved_keys_alone`."""

TOLERATE_EVERYTHING_MESSAGE = (
    "an empty key with operator Exists tolerates every taint (control-plane and node-problem taints "
    "included); name the taint's key"
)
"""`spec.template.tolerations[i]`: the message of `Toleration.tolerates_a_named_taint`."""


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration)."""

    # Typed (not free-form) so that CEL can read it; `operator` and `effect` stay strings, whose values the
    # API server checks when it creates the Job.

    @rule(
        "",
        "(has(self.key) && self.key != '') || !has(self.operator) || self.operator != 'Exists'",
        TOLERATE_EVERYTHING_MESSAGE,
    )
    def tolerates_a_named_taint(self) -> bool:
        return bool(self.key) or self.operator != "Exists"

    key: str | None = Field(default=None, max_length=317, description="Taint key (required by the pod policy).")
    operator: str | None = Field(default=None, max_length=16, description="Exists or Equal. Default: Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value, with operator Equal.")
    effect: str | None = Field(
        default=None, max_length=32, description="NoSchedule, PreferNoSchedule or NoExecute. Default: all effects."
    )
    toleration_seconds: int | None = Field(default=None, description="How long a NoExecute taint is tolerated.")


class PodTemplate(ApiModel):
    """Pod-level knobs for the trainer pods, within the operator's pod policy.

    Whoever may create a FineTuneJob gets pods created by the operator, so the operator's pod policy
    (`ftjob operator --allowed-*` flags, the chart's `podPolicy` values) decides which images, ServiceAccounts,
    priority classes, annotations, labels, tolerations and securityContext values a template may ask for.
    """

    @rule(".labels", f"!has(self.labels) || self.labels.all(k, !{_reserved_label('k')})", RESERVED_LABELS_MESSAGE)
    def labels_leave_reserved_keys_alone(self) -> bool:
        return not any(reserved_label(key) for key in self.labels)

    image: str | None = Field(
        default=None,
        max_length=512,
        description="Trainer image; the pod policy's allowed images only. Default: the operator's.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Image pull policy. Default: Kubernetes' (IfNotPresent for tagged images)."
    )
    resources: FreeForm = Field(default_factory=dict, description="Container resources; GPUs are set from the spec.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node selector.")
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=64,
        description="Tolerations; keys from the pod policy's allowed tolerations, never an empty key with Exists.",
    )
    affinity: FreeForm | None = Field(default=None, description="Affinity.")
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        description="PriorityClass; system-* classes only where the pod policy names them.",
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra pod labels; keys under the pod policy's allowed label prefixes, none reserved.",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Extra pod annotations; keys under the pod policy's allowed annotation prefixes.",
    )
    env: list[FreeForm] = Field(
        default_factory=list,
        max_length=128,
        description="Extra container env vars; a secretKeyRef only to a Secret key the spec names elsewhere.",
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        description="Pod ServiceAccount; the pod policy's allowed ones only. Default: the namespace's default.",
    )
    security_context: FreeForm | None = Field(
        default=None,
        description=(
            "Trainer container securityContext, merged key by key over the operator's (non-root uid 65532, no "
            "privilege escalation, no capabilities, RuntimeDefault seccomp, read-only root filesystem); values "
            "looser than the pod policy's security level (default: restricted) are refused."
        ),
    )
    shm_size: Quantity = Field(default="64Gi", description="Size of the memory-backed /dev/shm. Default: 64Gi.")


_IMMUTABLE = ("model", "dataset", "adapter", "training", "distributed", "output", "template")


def _unchanged(field: str) -> str:
    return f"(has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field}))"


_IMMUTABLE_RULE = (
    "(has(oldSelf.runPolicy) && has(oldSelf.runPolicy.suspend) && oldSelf.runPolicy.suspend) || ("
    + " && ".join(_unchanged(f) for f in _IMMUTABLE)
    + ")"
)


def _as_written(spec: ApiModel, field: str) -> dict[str, Any] | None:
    """A section as the object holds it, which is what CEL compares: None when absent, else the fields set."""
    if field not in spec.model_fields_set:
        return None
    section: ApiModel = getattr(spec, field)
    return section.to_dict(exclude_unset=True)


_NOT_FP8 = "(!has(self.training) || !has(self.training.precision) || self.training.precision != 'fp8')"
"""CEL: the spec does not ask for `training.precision: fp8` (the start of each fp8 rule of FineTuneJobSpec)."""


class FineTuneJobSpec(ApiModel):
    """What to fine-tune, on what data, how, where it runs and where the result goes."""

    @rule(
        ".model.quantization",
        "!has(self.model.quantization) || !has(self.adapter) || !has(self.adapter.type) || self.adapter.type == 'lora'",
        "model.quantization (QLoRA) needs a LoRA adapter (adapter.type: lora)",
    )
    def qlora_is_lora(self) -> bool:
        return self.model.quantization is None or self.adapter.type == "lora"

    @rule(
        ".distributed.deepspeed.offloadParams",
        "!has(self.distributed) || !has(self.distributed.deepspeed) || "
        "!has(self.distributed.deepspeed.offloadParams) || self.distributed.deepspeed.offloadParams "
        "== 'none' || !has(self.distributed.deepspeed.zeroStage) || "
        "type(self.distributed.deepspeed.zeroStage) == string || self.distributed.deepspeed.zeroStage == 3",
        "distributed.deepspeed.offloadParams needs zeroStage 3; set zeroStage: 3 or offloadParams: none",
    )
    def params_offload_is_zero3(self) -> bool:
        deepspeed = self.distributed.deepspeed
        return deepspeed.offload_params == "none" or deepspeed.zero_stage in (3, "auto")

    @rule(
        ".distributed.deepspeed.offloadOptimizer",
        "!has(self.distributed) || !has(self.distributed.deepspeed) || "
        "!has(self.distributed.deepspeed.offloadOptimizer) || "
        "self.distributed.deepspeed.offloadOptimizer == 'none' || "
        "!has(self.distributed.deepspeed.zeroStage) || "
        "type(self.distributed.deepspeed.zeroStage) == string || "
        "self.distributed.deepspeed.zeroStage >= 1",
        "distributed.deepspeed.offloadOptimizer needs zeroStage >= 1; set zeroStage: 1, 2 or 3, "
        "or offloadOptimizer: none",
    )
    def optimizer_offload_is_zero(self) -> bool:
        deepspeed = self.distributed.deepspeed
        return deepspeed.offload_optimizer == "none" or deepspeed.zero_stage != 0

    @rule(
        ".distributed.deepspeed.nvmePath",
        "!has(self.distributed) || !has(self.distributed.deepspeed) || "
        "(has(self.distributed.deepspeed.nvmePath) && self.distributed.deepspeed.nvmePath != '') || "
        "((!has(self.distributed.deepspeed.offloadOptimizer) || "
        "self.distributed.deepspeed.offloadOptimizer != 'nvme') && "
        "(!has(self.distributed.deepspeed.offloadParams) || "
        "self.distributed.deepspeed.offloadParams != 'nvme'))",
        "distributed.deepspeed.nvmePath is required with nvme offload; set it to a local NVMe mount",
        reason="FieldValueRequired",
    )
    def nvme_offload_has_a_path(self) -> bool:
        deepspeed = self.distributed.deepspeed
        return bool(deepspeed.nvme_path) or "nvme" not in (deepspeed.offload_optimizer, deepspeed.offload_params)

    @rule(
        ".training.saveSteps",
        "!has(self.training) || !has(self.training.saveStrategy) || "
        "self.training.saveStrategy != 'steps' || has(self.training.saveSteps)",
        "training.saveSteps is required with saveStrategy: steps",
        reason="FieldValueRequired",
    )
    def step_saves_say_when(self) -> bool:
        return self.training.save_strategy != "steps" or self.training.save_steps is not None

    @rule(
        ".training.precision",
        f"{_NOT_FP8} || !has(self.model.quantization)",
        FP8_NO_QUANTIZATION,
    )
    def fp8_is_not_qlora(self) -> bool:
        return self.training.precision != "fp8" or self.model.quantization is None

    @rule(
        ".training.precision",
        f"{_NOT_FP8} || (has(self.distributed) && has(self.distributed.deepspeed) && "
        "has(self.distributed.deepspeed.zeroStage) && (type(self.distributed.deepspeed.zeroStage) == string || "
        "self.distributed.deepspeed.zeroStage <= 2))",
        FP8_NO_ZERO3,
    )
    def fp8_is_not_zero3(self) -> bool:
        return self.training.precision != "fp8" or self.distributed.deepspeed.zero_stage != 3

    @rule(
        ".training.precision",
        f"{_NOT_FP8} || !has(self.distributed) || !has(self.distributed.gpusPerNode) || "
        "self.distributed.gpusPerNode > 0",
        FP8_NEEDS_GPUS,
    )
    def fp8_runs_on_gpus(self) -> bool:
        return self.training.precision != "fp8" or self.distributed.gpus_per_node > 0

    @transition_rule(
        "",
        _IMMUTABLE_RULE,
        "the spec of a running job is immutable except runPolicy; set runPolicy.suspend: true first",
    )
    def unchanged_while_running(self, old: "FineTuneJobSpec") -> bool:
        return old.run_policy.suspend or all(_as_written(self, f) == _as_written(old, f) for f in _IMMUTABLE)

    model: ModelSpec = Field(description="Base model.")
    dataset: DatasetSpec = Field(description="Training data.")
    adapter: AdapterSpec = Field(default_factory=AdapterSpec, description="PEFT adapter. Default: LoRA r=8.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Hyper-parameters.")
    distributed: DistributedSpec = Field(default_factory=DistributedSpec, description="Nodes, GPUs, ZeRO.")
    output: OutputSpec = Field(default_factory=OutputSpec, description="Hub push and checkpoint volume.")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Retries, deadline, TTL, suspend.")
    template: PodTemplate = Field(default_factory=PodTemplate, description="Pod-level knobs.")
