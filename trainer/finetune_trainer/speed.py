"""Performance levers for the trainer, each one optional and measured in `bench/` (bench/README.md).

* `varlen` attention: packed (padding-free) batches are attended per document with PyTorch's variable-length
  flash kernel (`torch.nn.attention.varlen.varlen_attn`, torch >= 2.9) instead of transformers' SDPA path, which
  turns packed `position_ids` into a dense (tokens x tokens) block-diagonal mask: SDPA then can use neither its
  flash kernel nor skip the masked blocks (8x the useful attention work at 4 x 2048 tokens per row). Documents never
  attend to each other in either path; where the varlen kernel is missing (CPU, older torch) each document runs
  through causal SDPA on its own, which is exact too.
* `liger`: Liger's Triton kernels for RoPE, RMSNorm and SwiGLU, applied to the model instance (TRL's
  `use_liger_kernel` flag is deprecated). The loss keeps TRL's own chunked LM head.
* `compile`: `torch.compile` of each decoder layer.
* `fused_adamw`: torch's fused AdamW (only where the Trainer owns the optimizer step: no DeepSpeed).

Besides the levers, `checkpoint_only` checkpoints only the planner's count of decoder layers (trainer.json's
`strategy.checkpointedLayers`; `gradientCheckpointing: auto` in operator/finetune_operator/plan.py): the layers
left out keep their activations and skip the recompute.

Nothing here changes what is trained: same parameters, same data, same loss (up to kernel rounding).

Which levers run is decided by `resolve_levers` (automatic, CUDA only; bench/README.md has the measurements behind
each rule); the environment variable FTJOB_SPEED overrides it: `none`, or a comma list such as `varlen,liger`.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from collections.abc import Iterable
from typing import Any

from finetune_api import constants
from finetune_api.trainer_input import TrainerInput

log = logging.getLogger(__name__)

VARLEN_ATTENTION = "ftjob_varlen_sdpa"
LEVERS = ("varlen", "liger", "compile", "fused_adamw")

_state: dict[str, Any] = {"registered": False, "expand_kv": False, "kernel": None, "warned": set()}


def parse_levers(value: str | Iterable[str] | None) -> set[str]:
    """'varlen,liger' (or a list) -> {'varlen', 'liger'}; unknown names are an error, 'none' means none."""
    if value is None:
        return set()
    items = value.split(",") if isinstance(value, str) else list(value)
    levers = {x.strip() for x in items if x.strip() and x.strip() != "none"}
    unknown = levers - set(LEVERS)
    if unknown:
        raise ValueError(f"unknown speed levers {sorted(unknown)}; known: {', '.join(LEVERS)}")
    return levers


def resolve_levers(cfg: TrainerInput, *, cuda: bool, env: dict[str, str] | None = None) -> set[str]:
    """The levers for this run. Automatic rules, on CUDA only (CPU runs stay as they were):

    * varlen   whenever packing is on (padding-free batches): +41% tokens/s on 8B, 1 GPU, no checkpointing;
    * compile  when the Trainer owns the whole model (no DeepSpeed), checkpointing is off and the model is not
               4-bit: +41% over varlen alone (torch.compile under ZeRO-3 hooks, checkpoint recompute or
               bitsandbytes layers was not measured, so it stays off there);
    * liger    where compile is not applied (it fuses the same RMSNorm/SwiGLU/RoPE work): +15% over varlen;
    * fused_adamw  without DeepSpeed (DeepSpeed steps its own optimizer partitions): within noise, harmless.
    """
    import os

    override = (env if env is not None else os.environ).get(constants.ENV_SPEED)
    if override is not None:
        return parse_levers(override)
    if not cuda:
        return set()
    levers: set[str] = set()
    stage = cfg.strategy.zero_stage
    quantized = cfg.model.quantization is not None
    if cfg.dataset.packing:
        levers.add("varlen")
    # gradientCheckpointing arrives resolved by the planner (auto: off when the step fits the GPU)
    if stage == 0 and cfg.training.gradient_checkpointing is False and not quantized:
        levers.add("compile")
    elif importlib.util.find_spec("liger_kernel") is not None:
        levers.add("liger")
    if stage == 0:
        levers.add("fused_adamw")
    return levers


# ------------------------------------------------------------------------------------------------------------
# variable-length attention
# ------------------------------------------------------------------------------------------------------------
def _varlen_kernel() -> Any:
    """torch.nn.attention.varlen.varlen_attn, or None when this torch has none."""
    if _state["kernel"] is None:
        try:
            from torch.nn.attention.varlen import varlen_attn

            _state["kernel"] = varlen_attn
        except ImportError:
            _state["kernel"] = False
    return _state["kernel"] or None


def _once(key: str, msg: str, *args: Any) -> None:
    """Log `msg` the first time `key` is seen, and never while torch.compile traces: dynamo cannot trace a
    `Logger` call, so one inside a compiled decoder layer splits its graph in two (one break per layer and a
    guard on this module's state; bench/README.md, "Recompiles"). What the compiled path does is logged at
    setup instead (`apply_to_model`)."""
    import torch

    if torch.compiler.is_compiling() or key in _state["warned"]:
        return
    _state["warned"].add(key)
    log.info(msg, *args)


def cu_seqlens_from_position_ids(position_ids: Any) -> tuple[Any, int]:
    """Document boundaries of one packed row: every position 0 starts a document."""
    import torch

    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == 0, as_tuple=False).reshape(-1)
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([torch.zeros(1, dtype=starts.dtype, device=starts.device), starts])
    total = torch.tensor([pos.numel()], dtype=starts.dtype, device=starts.device)
    cu = torch.cat([starts, total]).to(torch.int32)
    return cu, int(cu.diff().max())


def _per_document_sdpa(q: Any, k: Any, v: Any, cu: Any, scaling: float | None) -> Any:
    """Exact fallback: causal SDPA on each document. q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]."""
    import itertools

    import torch
    from torch.nn.functional import scaled_dot_product_attention

    groups = q.shape[1] // k.shape[1]
    bounds = cu.tolist()
    outs = []
    for s, e in itertools.pairwise(bounds):
        if e <= s:
            continue
        qi = q[s:e].transpose(0, 1).unsqueeze(0)
        ki = k[s:e].transpose(0, 1).unsqueeze(0)
        vi = v[s:e].transpose(0, 1).unsqueeze(0)
        if groups > 1:
            ki = ki.repeat_interleave(groups, dim=1)
            vi = vi.repeat_interleave(groups, dim=1)
        o = scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scaling)
        outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)


def _varlen_params(kernel: Any) -> Any:
    """The kernel's parameter names, read once (at setup by `apply_to_model`, so never inside a compiled graph)."""
    params = _state.get("params")
    if params is None:
        params = _state["params"] = inspect.signature(kernel).parameters
    return params


def _call_varlen(kernel: Any, q: Any, k: Any, v: Any, cu: Any, max_len: int, scaling: float | None) -> Any:
    """varlen_attn across torch versions: 2.9/2.10 take `is_causal`, later ones `window_size=(-1, 0)`."""
    params = _varlen_params(kernel)
    kwargs: dict[str, Any] = {}
    if "is_causal" in params:
        kwargs["is_causal"] = True
    else:
        kwargs["window_size"] = (-1, 0)
    if scaling is not None:
        if "scale" in params:
            kwargs["scale"] = scaling
        elif abs(scaling - q.shape[-1] ** -0.5) > 1e-6:
            raise TypeError("this varlen_attn has no `scale` argument")
    if _state["expand_kv"] and k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return kernel(q, k, v, cu, cu, max_len, max_len, **kwargs)


def varlen_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers attention interface: (B, H, S, D) in, (B, S, H, D) out.

    Packed rows (TRL's padding-free collator gives `cu_seq_lens_q`, or `position_ids` restart at 0) go through the
    varlen kernel; anything else (no packing, a padding mask, a KV cache) is handed to transformers' SDPA.
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    max_len = kwargs.get("max_length_q")
    position_ids = kwargs.get("position_ids")
    b, h, s, d = query.shape
    packed = attention_mask is None and key.shape[2] == s and b == 1 and s > 1
    if packed and cu is None and position_ids is not None:
        cu, max_len = cu_seqlens_from_position_ids(position_ids)
    if not packed or cu is None or cu.numel() <= 2:  # not packed, or one document: plain causal SDPA is exact
        if attention_mask is not None and attention_mask.dim() == 2:
            # 2-D padding mask (unregistered implementations get it raw): causal AND not padding
            keep = attention_mask.bool()[:, None, None, :]
            causal = torch.ones(s, key.shape[2], dtype=torch.bool, device=query.device).tril(key.shape[2] - s)
            attention_mask = keep & causal[None, None]
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if dropout:
        _once("dropout", "varlen attention: attention dropout %s ignored (0.0 in Llama training)", dropout)
    cu = cu.to(device=query.device, dtype=torch.int32)
    max_len = int(max_len) if max_len is not None else int(cu.diff().max())
    q = query[0].transpose(0, 1)  # (S, H, D)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    kernel = _varlen_kernel() if query.is_cuda else None
    out = None
    if kernel is not None:
        try:
            out = _call_varlen(kernel, q, k, v, cu, max_len, scaling)
        except (RuntimeError, TypeError) as e:
            if not _state["expand_kv"] and k.shape[1] != q.shape[1]:
                _state["expand_kv"] = True
                _once("gqa", "varlen attention: GQA not accepted (%s); expanding K/V heads", str(e)[:200])
                out = _call_varlen(kernel, q, k, v, cu, max_len, scaling)
            else:
                _once("varlen-failed", "varlen attention unavailable (%s); per-document SDPA", str(e)[:200])
                _state["kernel"] = False
    if out is None:
        _once("per-doc", "attention: per-document causal SDPA on packed documents")
        out = _per_document_sdpa(q, k, v, cu, scaling)
    return out.reshape(1, s, h, d), None


def register_varlen_attention() -> str:
    """Register the implementation with transformers (idempotent) and return its name."""
    if not _state["registered"]:
        from transformers import AttentionInterface

        AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
        _state["registered"] = True
    return VARLEN_ATTENTION


def use_varlen_attention(model: Any) -> bool:
    """Switch an sdpa model to the varlen implementation; no mask is built for it (it is not a mask interface
    key), so packed batches cost no (tokens x tokens) mask either."""
    name = register_varlen_attention()
    current = getattr(model.config, "_attn_implementation", None)
    if current not in (None, "sdpa", name):
        log.info("varlen attention not applied: the model uses %s", current)
        return False
    try:
        model.set_attn_implementation(name)
    except Exception:
        model.config._attn_implementation = name
    return True


# ------------------------------------------------------------------------------------------------------------
# liger, compile, optimizer
# ------------------------------------------------------------------------------------------------------------
def apply_liger(model: Any) -> bool:
    """Liger RoPE/RMSNorm/SwiGLU on this model instance; False (logged) when liger-kernel is missing."""
    if importlib.util.find_spec("liger_kernel") is None:
        log.warning("speed: liger-kernel is not installed; skipping liger kernels")
        return False
    from liger_kernel.transformers import _apply_liger_kernel_to_instance  # type: ignore[import-not-found]

    _apply_liger_kernel_to_instance(
        model=model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False
    )
    return True


COMPILE_DYNAMIC: bool | None = None
"""`dynamic` for torch.compile of the decoder layers: None is PyTorch's automatic dynamic shapes (the first shape
compiled static, a dimension seen to change recompiled once as dynamic); True makes every dimension dynamic from
the first step (a first compile five times as long, bench/README.md "Recompiles"). With None, the token count is
marked dynamic from the first step anyway (`mark_tokens_dynamic`)."""


COMPILE_MODE: str | None = None
"""torch.compile's `mode` for the decoder layers: None is inductor's default. "reduce-overhead" also captures each
compiled layer (forward and backward) in a CUDA graph, meant to remove the launch gaps a profile shows as GPU idle
time; measured no faster (bench/README.md, run 22: with one compiled function per layer every forward graph runs
before any backward, so CUDA-graph trees take their slow path), hence not the default."""


def mark_tokens_dynamic(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Forward pre-hook of a compiled decoder layer: mark the token dimension of every input dynamic before dynamo
    sees it (`torch._dynamo.maybe_mark_dynamic`: a hint, never an error), and the document boundaries' length.

    Packed batches of documents of varying length change the token count; with automatic dynamic shapes the first
    compile is specialised to the first count and the first batch with another one recompiles every layer, however
    late it comes (bench run 15: step 19, 23 s, when the first batch under 8,192 tokens came).
    Marked here, the first compile is already general in the token count. The hidden states are [batch, tokens,
    hidden]; position embeddings, position ids and sequence indices carry the same token dimension."""
    import torch

    hidden = args[0] if args else kwargs.get("hidden_states")
    if hidden is None or hidden.dim() != 3:
        return
    tokens = hidden.shape[1]
    pending: list[Any] = [*args, *kwargs.values()]
    while pending:
        item = pending.pop()
        if isinstance(item, tuple | list):
            pending.extend(item)
        elif isinstance(item, torch.Tensor):
            for dim, size in enumerate(item.shape):
                if size == tokens and size > 1:
                    torch._dynamo.maybe_mark_dynamic(item, dim)
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        cu = kwargs.get(key)
        if isinstance(cu, torch.Tensor) and cu.dim() == 1 and cu.numel() > 2:
            torch._dynamo.maybe_mark_dynamic(cu, 0)


def compile_layers(model: Any, dynamic: bool | None = None, backend: str = "inductor") -> int:
    """torch.compile every decoder layer's `forward` (the embedding and TRL's LM head stay eager), with
    `mark_tokens_dynamic` as a pre-hook outside the compiled code; returns how many layers."""
    import torch

    layers = None
    for path in ("model.layers", "model.model.layers", "base_model.model.model.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        layers = obj
        break
    if layers is None:
        log.warning("speed: no decoder layers found to compile")
        return 0
    for layer in layers:
        dynamic_shapes = COMPILE_DYNAMIC if dynamic is None else dynamic
        layer.forward = torch.compile(layer.forward, dynamic=dynamic_shapes, backend=backend, mode=COMPILE_MODE)
        layer.register_forward_pre_hook(mark_tokens_dynamic, with_kwargs=True)
    return len(layers)


def checkpointed_layer_indices(total: int, count: int) -> list[int]:
    """`count` of `total` decoder layers, spread evenly from the first: after the backward pass has freed the full
    layers above a checkpointed one, its recompute never raises the peak (the planner's estimate assumes this)."""
    count = max(0, min(count, total))
    return sorted({(i * total) // count for i in range(count)}) if count else []


def checkpoint_only(model: Any, count: int) -> None:
    """Make activation checkpointing, whenever it is turned on (by the Trainer, or PEFT's k-bit preparation),
    checkpoint only `count` decoder layers (`checkpointed_layer_indices`); the rest keep their activations.

    transformers' `_set_gradient_checkpointing` sets every decoder layer's `gradient_checkpointing` flag (every
    `every_n_layers`-th one); this wraps it on the model instance and re-sets the flags afterwards, so every path that
    enables checkpointing goes through it. Same signature as the original (transformers inspects it)."""
    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_layers import GradientCheckpointingLayer

    original = model._set_gradient_checkpointing

    def set_gradient_checkpointing(
        enable: bool = True, gradient_checkpointing_func: Any = checkpoint, every_n_layers: int = 1
    ) -> None:
        original(enable=enable, gradient_checkpointing_func=gradient_checkpointing_func, every_n_layers=every_n_layers)
        if not enable:
            return
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        keep = set(checkpointed_layer_indices(len(layers), count))
        for index, layer in enumerate(layers):
            layer.gradient_checkpointing = index in keep
        _once("partial-ckpt", "activation checkpointing: %d of %d decoder layers", len(keep), len(layers))

    model._set_gradient_checkpointing = set_gradient_checkpointing


def apply_to_model(model: Any, levers: set[str], *, cuda: bool, packing: bool, quantized: bool = False) -> list[str]:
    """Apply the model-side levers that make sense here; returns those applied (for the log and the bench)."""
    applied: list[str] = []
    if "varlen" in levers and packing and use_varlen_attention(model):
        applied.append("varlen")
        kernel = _varlen_kernel() if cuda else None
        if kernel is not None:
            _varlen_params(kernel)
        # said here, not from inside the attention call: that runs in a compiled graph (see `_once`)
        _once(
            "varlen",
            "attention: %s on packed documents",
            "torch varlen flash kernel" if kernel is not None else "per-document causal SDPA",
        )
    if "liger" in levers and cuda and apply_liger(model):
        applied.append("liger")
    if "compile" in levers and cuda and not quantized and compile_layers(model):
        applied.append("compile")
    if applied:
        log.info("speed levers applied: %s", ", ".join(applied))
    _state["applied"] = sorted({*_state.get("applied", []), *applied})
    return applied


PACKED_PAD_MULTIPLE = 64
"""With compiled decoder layers, packed batches are padded to a multiple of this many tokens (TRL's collator:
`pad_to_multiple_of`; each pad token is a one-token document with label -100, so the loss and what is trained do
not change). Every matmul then sees a row count that is a multiple of 64: whole tensor-core tiles, and rows FP8's
`_scaled_mm` takes as they are (multiples of 16). At most 63 wasted tokens (< 1% of 8,192)."""


def pad_to_multiple_of(levers: set[str], *, packing: bool) -> int | None:
    """`pad_to_multiple_of` for SFTConfig: `PACKED_PAD_MULTIPLE` for packed batches into compiled layers."""
    return PACKED_PAD_MULTIPLE if packing and "compile" in levers else None


def applied_levers() -> list[str]:
    """What this process applied so far (the benchmark records it)."""
    return list(_state.get("applied", []))


def optimizer_name(levers: set[str], *, cuda: bool, deepspeed: bool) -> str | None:
    """`optim` for SFTConfig: fused AdamW when asked for and the Trainer (not DeepSpeed) steps it."""
    if "fused_adamw" in levers and cuda and not deepspeed:
        _state["applied"] = sorted({*_state.get("applied", []), "fused_adamw"})
        return "adamw_torch_fused"
    return None
