"""The memory planner: a per-GPU estimate for a job, and the `zeroStage: auto` choice.

The estimate adds, per GPU: base weights (sharded by ZeRO-3, 4-bit under QLoRA), the ZeRO-3 working
set of gathered layers, LoRA weights + gradients + Adam states (sharded by stage >= 1/2), activations
(every layer's inputs with checkpointing, or every saved tensor of every layer without it), logits
and the loss, and a fixed CUDA/NCCL overhead. DeepSpeed's own estimators count every parameter as
trainable, which is wrong by ~16 bytes/param for LoRA; this one counts only the adapter.

`auto` picks the lowest ZeRO stage (then the least offload) that fits the GPU with a margin: lower
stages communicate less, so they are faster. A LoRA run of a model that fits one GPU is plain data
parallel.

`gradientCheckpointing: auto` (the default) is decided here too, inside each ZeRO candidate: off when the step fits
with the margin (checkpointing recomputes every checkpointed layer's forward in the backward pass: 8B on one H200,
7,809 vs 13,509 tokens/s, bench/README.md), else the fewest checkpointed decoder layers that fit (spread evenly; each
one checkpointed trades the tensors it saves for one kept hidden state), else every layer, else every layer with
the checkpoints in host memory (`offloadActivations`). Only when none of these fits does `auto` move to the next
ZeRO candidate. Pure: no I/O.
"""

from dataclasses import dataclass, field

from finetune_api.v1alpha1.errors import FieldError, InvalidSpecError
from finetune_api.v1alpha1.spec import FineTuneJobSpec, ModelShape

GIB = 1024**3
CUDA_OVERHEAD_BYTES = 2.5 * GIB  # CUDA context, NCCL buffers, allocator fragmentation
# Calibrated on 2x H200 (bench/README.md, 2026-11-29; torch 2.11, transformers 5.24, TRL 1.16, DeepSpeed 0.19.8,
# bitsandbytes 0.50.2, 8B-shaped Llama, LoRA r=8): ZeRO-3's gather/release churn leaves ~2.5 GiB reserved but
# unallocated in the caching allocator (ZeRO-2/DDP: 0.5-1.3 GiB), and bitsandbytes' 4-bit layers another ~1.4 GiB.
ZERO3_FRAGMENTATION_BYTES = 1.5 * GIB
QUANT_FRAGMENTATION_BYTES = 1.5 * GIB
# DeepSpeed keeps up to stage3_max_live_parameters (default 1e9) gathered parameters resident on each GPU.
ZERO3_MAX_LIVE_PARAMETERS = 1e9
FIT_MARGIN = 0.9  # use at most 90% of the GPU
# bitsandbytes 4-bit: half a byte per weight plus one absmax per 64 weights (fp32; with double quant an 8-bit absmax
# plus one fp32 per 256 blocks). Measured: the whole 70B model in nf4 + double quant holds 34.3 GiB on a GPU.
QUANT_4BIT_BYTES = 0.5 + 4 / 64
QUANT_4BIT_DOUBLE_QUANT_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
ADAM_STATE_BYTES = 4 + 4 + 8  # fp32 weight, fp32 grad, two fp32 moments
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# Known architectures, matched by lower-case substrings of the model name (first match wins).
KNOWN_SHAPES: list[tuple[tuple[str, ...], ModelShape]] = [
    (
        ("builtin:tiny-llama",),
        ModelShape(
            num_parameters=206_000,
            hidden_size=64,
            num_layers=2,
            intermediate_size=172,
            vocab_size=512,
            num_attention_heads=4,
            num_key_value_heads=4,
        ),
    ),
    (
        ("llama-3-70b", "llama-3.1-70b", "llama-3.3-70b"),
        ModelShape(
            num_parameters=70_553_706_496,
            hidden_size=8192,
            num_layers=80,
            intermediate_size=28672,
            vocab_size=128256,
            num_attention_heads=64,
            num_key_value_heads=8,
        ),
    ),
    (
        ("llama-2-70b",),
        ModelShape(
            num_parameters=68_976_648_192,
            hidden_size=8192,
            num_layers=80,
            intermediate_size=28672,
            vocab_size=32000,
            num_attention_heads=64,
            num_key_value_heads=8,
        ),
    ),
    (
        ("llama-2-13b",),
        ModelShape(
            num_parameters=13_015_864_320,
            hidden_size=5120,
            num_layers=40,
            intermediate_size=13824,
            vocab_size=32000,
            num_attention_heads=40,
            num_key_value_heads=40,
        ),
    ),
    (
        ("llama-3-8b", "llama-3.1-8b"),
        ModelShape(
            num_parameters=8_030_261_248,
            hidden_size=4096,
            num_layers=32,
            intermediate_size=14336,
            vocab_size=128256,
            num_attention_heads=32,
            num_key_value_heads=8,
        ),
    ),
    (
        ("llama-2-7b",),
        ModelShape(
            num_parameters=6_738_415_616,
            hidden_size=4096,
            num_layers=32,
            intermediate_size=11008,
            vocab_size=32000,
            num_attention_heads=32,
            num_key_value_heads=32,
        ),
    ),
    (
        ("mistral-7b",),
        ModelShape(
            num_parameters=7_241_732_096,
            hidden_size=4096,
            num_layers=32,
            intermediate_size=14336,
            vocab_size=32000,
            num_attention_heads=32,
            num_key_value_heads=8,
        ),
    ),
]

FP8_NOT_ZERO3 = "stage 3: not with training.precision fp8 (ZeRO-3 shards the base weights that fp8 replaces)"
"""Why `auto` skips ZeRO-3 for an fp8 job: the trainer swaps each frozen base linear for FP8 copies of its whole
weight, which a ZeRO-3 partition does not hold. (fp8's base weights take 2 x 1 byte per decoder-linear parameter,
bf16's 2 bytes: the estimate is the same.)"""

# Candidate strategies for `auto`, cheapest communication first.
AUTO_LADDER: list[tuple[int, str, str]] = [
    (0, "none", "none"),
    (1, "none", "none"),
    (2, "none", "none"),
    (3, "none", "none"),
    (3, "cpu", "none"),
    (3, "cpu", "cpu"),
]


@dataclass(frozen=True)
class Strategy:
    """A resolved ZeRO stage and offload."""

    zero_stage: int
    offload_optimizer: str = "none"
    offload_params: str = "none"

    @property
    def offload(self) -> str:
        parts = [f"optimizer:{self.offload_optimizer}"] if self.offload_optimizer != "none" else []
        parts += [f"params:{self.offload_params}"] if self.offload_params != "none" else []
        return ",".join(parts) or "none"


@dataclass(frozen=True)
class Checkpointing:
    """How many decoder layers keep only their input (one hidden state) for a recompute in the backward pass."""

    layers: int
    """Checkpointed decoder layers, spread evenly from the first (the trainer's `speed.checkpoint_only`); 0 = off."""
    total: int
    """The model's decoder layers."""
    offload: bool = False
    """The kept hidden states live in pinned host memory (`offloadActivations`)."""

    @property
    def enabled(self) -> bool:
        return self.layers > 0

    @property
    def partial(self) -> bool:
        return 0 < self.layers < self.total

    def describe(self) -> str:
        """`off`, `all 32 layers`, `11 of 32 layers`, `..., checkpoints in host memory`."""
        if not self.enabled:
            return "off"
        text = f"{self.layers} of {self.total} layers" if self.partial else f"all {self.total} layers"
        return text + (", checkpoints in host memory" if self.offload else "")


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes by component of a training step, and of model loading where that is higher."""

    parts: dict[str, float] = field(default_factory=dict)
    # ZeRO-3 with `zero3Init: false`: every GPU holds the whole model until DeepSpeed partitions it. (QLoRA did too
    # before the trainer partitioned each 4-bit weight as it is quantized: 34.3 GiB per GPU for 70B on 2 GPUs,
    # above the step's 28.4; now 18.5, below it.)
    loading: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    @property
    def peak_gib(self) -> float:
        """What must fit: the training step or the load, whichever is higher."""
        return max(self.total, self.loading) / GIB


@dataclass(frozen=True)
class Plan:
    """What the planner chose for a job, with the estimate behind it."""

    strategy: Strategy
    estimate: MemoryEstimate
    gpu_memory_gib: float
    shape: ModelShape
    lora_parameters: int
    reason: str
    checkpointing: Checkpointing | None = None
    """None: every layer (a Plan built without a checkpointing choice)."""
    checkpointing_reason: str = ""
    """What was chosen for activation checkpointing and why (with `auto`: the estimates that decided it)."""

    @property
    def chosen_checkpointing(self) -> Checkpointing:
        """`checkpointing`, or every layer for a Plan built without a choice."""
        layers = self.shape.num_layers
        return self.checkpointing if self.checkpointing is not None else Checkpointing(layers, layers)

    @property
    def checkpointing_summary(self) -> str:
        """One line for status.plan and `ftjob plan`: what and why."""
        what = self.chosen_checkpointing.describe()
        return f"{what}: {self.checkpointing_reason}" if self.checkpointing_reason else what

    @property
    def fits(self) -> bool:
        return self.estimate.peak_gib <= self.gpu_memory_gib * FIT_MARGIN


def model_shape(spec: FineTuneJobSpec) -> ModelShape | None:
    """The spec's explicit shape, else a known one by name, else None."""
    if spec.model.shape is not None:
        return spec.model.shape
    name = spec.model.name.lower()
    return next((shape for keys, shape in KNOWN_SHAPES if any(key in name for key in keys)), None)


def lora_parameter_count(spec: FineTuneJobSpec, shape: ModelShape) -> int:
    """Trainable LoRA parameters: r x (in + out) for every targeted linear of every layer."""
    h = shape.hidden_size
    inter = shape.intermediate_size or int(3.5 * h)
    heads = shape.num_attention_heads or 1
    kv = h * (shape.num_key_value_heads or heads) // heads
    linears = {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }
    targets = spec.adapter.target_modules
    chosen = linears.values() if targets == "all-linear" else [linears[t] for t in targets if t in linears]
    return spec.adapter.r * sum(i + o for i, o in chosen) * shape.num_layers


def requested_checkpointing(spec: FineTuneJobSpec, num_layers: int) -> Checkpointing:
    """The checkpointing the spec names; `auto` is estimated as every layer (the planner resolves it in plan_job)."""
    training = spec.training
    if training.gradient_checkpointing is False:
        return Checkpointing(0, num_layers)
    return Checkpointing(num_layers, num_layers, offload=training.offload_activations)


def checkpointing_candidates(spec: FineTuneJobSpec, num_layers: int) -> list[Checkpointing]:
    """What `plan_job` may choose, fastest first: the spec's own choice when it makes one; for `auto` off, then 1, 2,
    ... num_layers - 1 checkpointed layers, then every layer, then every layer with the checkpoints in host memory.
    `auto` with `offloadActivations: true` is every layer, offloaded (the user asked for the host copy)."""
    training = spec.training
    if training.gradient_checkpointing != "auto" or training.offload_activations:
        return [requested_checkpointing(spec, num_layers)]
    return [
        *(Checkpointing(count, num_layers) for count in range(num_layers)),
        Checkpointing(num_layers, num_layers),
        Checkpointing(num_layers, num_layers, offload=True),
    ]


def estimate_memory(
    spec: FineTuneJobSpec, shape: ModelShape, strategy: Strategy, checkpointing: Checkpointing | None = None
) -> MemoryEstimate:
    """Per-GPU peak bytes of one training step under `strategy` and `checkpointing` (default: the spec's)."""
    if checkpointing is None:
        checkpointing = requested_checkpointing(spec, shape.num_layers)
    dist, training = spec.distributed, spec.training
    gpus = max(dist.nodes * max(dist.gpus_per_node, 1), 1)
    h, layers = shape.hidden_size, shape.num_layers
    inter = shape.intermediate_size or int(3.5 * h)
    quant = spec.model.quantization
    compute_bytes = 4 if training.mixed_precision == "no" and quant is None else 2
    if quant is not None:
        weight_bytes = QUANT_4BIT_DOUBLE_QUANT_BYTES if quant.double_quant else QUANT_4BIT_BYTES
    else:
        weight_bytes = compute_bytes
    stage = strategy.zero_stage

    if quant is not None:
        # bitsandbytes quantizes the decoder's linears only: the input embedding and lm_head stay in the storage
        # dtype (2 x vocab x hidden parameters for an untied head).
        unquantized = min(2 * shape.vocab_size * h, shape.num_parameters)
        base = (shape.num_parameters - unquantized) * weight_bytes + unquantized * compute_bytes
    else:
        base = shape.num_parameters * weight_bytes
    layer_params = 4 * h * h + 3 * h * inter
    parts: dict[str, float] = {}
    if stage == 3:
        parts["base weights (sharded)"] = 0.0 if strategy.offload_params != "none" else base / gpus
        # Gathered parameters: DeepSpeed keeps up to stage3_max_live_parameters resident (at least the current and
        # the prefetched layer), in the weights' own dtype (4-bit packed under QLoRA).
        live = min(max(ZERO3_MAX_LIVE_PARAMETERS, 2 * layer_params), shape.num_parameters)
        parts["gathered layers"] = live * weight_bytes
    else:
        parts["base weights"] = base
    lora = lora_parameter_count(spec, shape)
    weights = lora * 4
    grads = lora * 4 / (gpus if stage >= 2 else 1)
    optimizer = (
        0.0 if strategy.offload_optimizer != "none" else lora * (ADAM_STATE_BYTES - 8) / (gpus if stage >= 1 else 1)
    )
    parts["lora weights+grads+adam"] = weights + grads + optimizer

    tokens = training.per_device_train_batch_size * spec.dataset.max_seq_len
    # Every tensor a layer saves for backward, per token: the base layer's (8h + 4 inter) plus, with LoRA
    # dropout, the dropped-out copies of each adapted linear's input (measured: ~1 more intermediate-wide tensor).
    lora_dropout = spec.adapter.dropout > 0
    per_layer_full = (8 * h + (5 if lora_dropout else 4) * inter) * compute_bytes
    checkpointed = min(checkpointing.layers, layers)
    if checkpointed and not checkpointing.offload:
        # One hidden state per checkpointed layer is kept for the recompute (in host memory with offloadActivations).
        parts["activations (checkpointed)"] = tokens * checkpointed * h * compute_bytes
    logits = min(tokens, 32768) * shape.vocab_size * compute_bytes
    if checkpointed == layers:
        # Everything one layer saves while it is recomputed, on top of all the kept hidden states. The logits and the
        # loss are freed before the first recompute (the backward pass starts at the loss), so only what the
        # recompute needs beyond them raises the peak (measured, 8B on one GPU, every layer: 21.1 GiB on the device;
        # counting both: 23.3, +10.5%). With only some layers checkpointed (spread evenly) the backward pass has
        # freed the full layers above one before it recomputes it, so the peak stays at the end of the forward pass.
        parts["activations (layer in recompute)"] = max(0.0, tokens * per_layer_full - logits)
    if checkpointed < layers:
        # Layers not checkpointed keep every tensor they save for the backward pass.
        key = "activations" if not checkpointed else "activations (layers not checkpointed)"
        parts[key] = tokens * (layers - checkpointed) * per_layer_full
    # TRL 1.16 computes the loss with a chunked, fused LM head: one chunk of logits in the compute dtype is alive
    # at a time (32768 tokens per chunk), never the fp32 logits of the whole batch.
    parts["logits + loss"] = logits
    if dist.gpus_per_node:
        parts["cuda/nccl overhead"] = CUDA_OVERHEAD_BYTES
        if stage == 3:
            parts["zero-3 allocator fragmentation"] = ZERO3_FRAGMENTATION_BYTES
        if quant is not None:
            parts["4-bit allocator fragmentation"] = QUANT_FRAGMENTATION_BYTES
    # Without zero.Init each GPU holds the whole model before DeepSpeed partitions it. A 4-bit model is never built
    # under zero.Init, but the trainer partitions each weight as it is quantized (finetune_trainer.model), so its load
    # stays below the step: base / GPUs plus one layer.
    whole_model_at_load = stage == 3 and quant is None and not dist.deepspeed.zero3_init
    loading = base + CUDA_OVERHEAD_BYTES if whole_model_at_load and dist.gpus_per_node else 0.0
    return MemoryEstimate(parts, loading)


def requested_strategy(spec: FineTuneJobSpec) -> Strategy | None:
    """The strategy the spec names, or None for `auto`."""
    ds = spec.distributed.deepspeed
    if ds.zero_stage == "auto":
        return None
    return Strategy(ds.zero_stage, ds.offload_optimizer, ds.offload_params)


def _fits(spec: FineTuneJobSpec, estimate: MemoryEstimate) -> bool:
    """Within FIT_MARGIN of one GPU (a CPU job always fits: the planner does not model host memory)."""
    gpu_gib = spec.distributed.gpu_memory_gi_b
    return not spec.distributed.gpus_per_node or estimate.peak_gib <= gpu_gib * FIT_MARGIN


def _checkpointing_reason(
    spec: FineTuneJobSpec, shape: ModelShape, chosen: Checkpointing, estimate: MemoryEstimate, faster: list[str]
) -> str:
    """Why `chosen`: as requested, or (auto) the estimate that fits and those of the faster choices that did not."""
    if spec.training.gradient_checkpointing != "auto":
        return "as requested"
    if spec.training.offload_activations:
        return "auto with offloadActivations: every layer, checkpoints in host memory"
    gpu_gib = spec.distributed.gpu_memory_gi_b
    if not spec.distributed.gpus_per_node:
        return "auto: a CPU job (host memory is not planned), so nothing is recomputed"
    head = (
        f"auto: {estimate.peak_gib:.1f} GiB fits {FIT_MARGIN:.0%} of {gpu_gib:g} GiB"
        if _fits(spec, estimate)
        else f"auto: nothing fits {FIT_MARGIN:.0%} of {gpu_gib:g} GiB; the least memory, {estimate.peak_gib:.1f} GiB"
    )
    if not faster:
        return head
    return head + (f" ({faster[0]} does not)" if len(faster) == 1 else f" ({faster[0]}, ..., {faster[-1]} do not)")


def _choose_checkpointing(
    spec: FineTuneJobSpec, shape: ModelShape, strategy: Strategy
) -> tuple[Checkpointing, MemoryEstimate, str, bool]:
    """The fastest checkpointing candidate that fits under `strategy` (else the one needing the least memory), its
    estimate, the reason and whether it fits."""
    tried: list[str] = []
    candidates = checkpointing_candidates(spec, shape.num_layers)
    for ck in candidates:
        estimate = estimate_memory(spec, shape, strategy, ck)
        if _fits(spec, estimate):
            return ck, estimate, _checkpointing_reason(spec, shape, ck, estimate, tried), True
        tried.append(f"{ck.describe()}: {estimate.peak_gib:.1f} GiB")
    last = candidates[-1]
    estimate = estimate_memory(spec, shape, strategy, last)
    return last, estimate, _checkpointing_reason(spec, shape, last, estimate, tried[:-1]), False


def plan_job(spec: FineTuneJobSpec) -> Plan:
    """Resolve `auto` (ZeRO stage and checkpointing) and estimate memory; raise InvalidSpecError when `auto` finds
    nothing that fits."""
    shape = model_shape(spec)
    requested = requested_strategy(spec)
    gpu_gib = spec.distributed.gpu_memory_gi_b
    if shape is None:
        if requested is None:
            raise InvalidSpecError.from_message(
                "spec.distributed.deepspeed.zeroStage",
                f"'auto' needs the model's size, and {spec.model.name!r} is not a known model; "
                "set spec.model.shape (numParameters, hiddenSize, numLayers) or choose a zeroStage",
            )
        auto = spec.training.gradient_checkpointing == "auto"
        return Plan(
            requested,
            MemoryEstimate(),
            gpu_gib,
            ModelShape(num_parameters=1, hidden_size=1, num_layers=1),
            0,
            "model size unknown: no estimate (set spec.model.shape for one)",
            requested_checkpointing(spec, 1),
            "auto with the model size unknown: every layer, the safe choice (set spec.model.shape)"
            if auto
            else "as requested",
        )
    lora = lora_parameter_count(spec, shape)
    if requested is not None:
        ck, estimate, ck_reason, fits = _choose_checkpointing(spec, shape, requested)
        reason = (
            "as requested"
            if fits
            else (
                f"as requested; estimated {estimate.peak_gib:.1f} GiB exceeds {FIT_MARGIN:.0%} of "
                f"{gpu_gib:g} GiB and may run out of memory"
            )
        )
        return Plan(requested, estimate, gpu_gib, shape, lora, reason, ck, ck_reason)
    ds = spec.distributed.deepspeed
    tried: list[str] = []
    for stage, off_opt, off_params in AUTO_LADDER:
        strategy = Strategy(
            stage,
            off_opt if ds.offload_optimizer == "none" else ds.offload_optimizer,
            off_params if ds.offload_params == "none" else ds.offload_params,
        )
        if strategy.offload_params != "none" and stage != 3:
            continue
        if strategy.offload_optimizer != "none" and stage == 0:
            continue
        if stage == 3 and spec.training.precision == "fp8":
            if FP8_NOT_ZERO3 not in tried:
                tried.append(FP8_NOT_ZERO3)
            continue
        ck, estimate, ck_reason, fits = _choose_checkpointing(spec, shape, strategy)
        if fits:
            reason = f"lowest ZeRO stage that fits: {estimate.peak_gib:.1f} GiB of {gpu_gib:g} GiB per GPU" + (
                f" ({', '.join(tried)} do not)" if tried else ""
            )
            return Plan(strategy, estimate, gpu_gib, shape, lora, reason, ck, ck_reason)
        tried.append(f"stage {stage}/{strategy.offload}: {estimate.peak_gib:.1f} GiB")
    raise InvalidSpecError(
        [
            FieldError(
                "spec.distributed",
                f"no ZeRO strategy fits {gpu_gib:g} GiB per GPU ({'; '.join(tried)}); add GPUs or nodes, "
                "quantize the model, enable gradientCheckpointing or lower perDeviceTrainBatchSize",
            )
        ]
    )
