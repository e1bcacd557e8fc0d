"""`training.precision: fp8`: the frozen base model's decoder linears run FP8 (e4m3) matmuls.

Why. A LoRA step spends most of its time in the base model's linear layers (forward, and the input gradient
backward: the base is frozen, so it has no weight gradient). Hopper-or-newer tensor cores (compute capability 8.9
and up) run e4m3 matmuls at twice the bf16 rate, so those two matmuls per layer are where FP8 pays. Everything the
optimizer touches or that is sensitive to rounding stays bf16: the adapter (lora_A, lora_B, its dropout), norms,
attention, embeddings, lm_head and the loss.

How. `apply_fp8` swaps each frozen `nn.Linear` inside the decoder layers (PEFT's `base_layer` of every LoRA layer,
and any plain frozen linear there; the first and last layer stay bf16, `BF16_EDGE_LAYERS`) for a
`Float8FrozenLinear`, which keeps two e4m3 copies of the weight W [out, in], each with one fp32 scale per row
(amax / 448, e4m3's largest value, so every row uses the whole range):

* `w_fwd` = W, scaled per output row: the forward y = x W^T;
* `w_bwd` = W^T stored contiguous [in, out], scaled per input column of W: the input gradient dX = dY W.

Two copies because `torch._scaled_mm` wants its second operand column-major and scales along the dimension
that is not reduced; a transposed view of one copy would need its scales along the reduced dimension, which
row-wise scaling cannot express. Two bytes per weight in all: what bf16 took, so the memory plan is unchanged.
Activations (x forward, dY backward) are quantized per row (per token) on the fly. The bf16 weight is freed.

The copies are buffers that are not persistent (the model's state_dict and the adapter checkpoint do not change:
the adapter is all that is saved). A whole-module cast such as DeepSpeed's `module.bfloat16()` converts every
floating-point buffer, and e4m3 counts as floating point: `Float8FrozenLinear._apply` lets such calls move the
copies between devices but keeps their dtypes (rather than storing raw bits as integers, which would put dtype
bitcasts into every compiled graph). DDP would broadcast every buffer from rank 0 before each forward
(`broadcast_buffers`), 2 bytes per base weight each step; `apply_fp8` names them in the model's
`_ddp_params_and_buffers_to_ignore` (every rank computes the same copies from the same weights).

The linear is a custom operator with its own autograd formula (`fp8_linear`, backward `_fp8_linear_backward`),
not a `torch.autograd.Function`: torch 2.11's dynamo routes the gradient of a traced autograd.Function to the wrong
output when the returned tensor aliases an intermediate (pytorch/pytorch#180642, fixed in 2.12), and the compiled
layers' input gradient came out as zeros on the H200 that way (eager was right). The quantization of x (forward)
and dY (backward) stays outside the opaque matmul (`fp8_matmul`), in code torch.compile traces, so inductor fuses
it into the neighbouring kernels. Without torch.compile (the trainer compiles decoder layers only without DeepSpeed
and without checkpointing, `finetune_trainer.speed`) the quantization runs as separate eager kernels and an FP8
linear is slower than a bf16 one (measured at 8192 x 4096 -> 14336 on an H200: 3.3 ms forward + input gradient,
against 2.4 in bf16). Row counts that are not a multiple of 16 (what `_scaled_mm` accepts) are padded with zero
rows. `torch._scaled_mm` with row-wise scales also runs on CPU, so the tests run this very code there.

Not with ZeRO-3 (it partitions the weights this replaces), 4-bit bases (no bf16 weights to convert) or
`mergeAdapter` (the bf16 base is gone): the API's rules refuse those specs, and `fp8_problem` refuses a GPU
without FP8 matmuls before the model loads.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)
"""448: the largest e4m3 value; a row's amax maps to it."""
AMAX_FLOOR = 1e-12
"""The smallest amax a scale is computed from, so an all-zero row quantizes to zeros instead of NaN."""
ROW_MULTIPLE = 16
"""`torch._scaled_mm` takes operands whose dimensions are multiples of 16; rows are padded up to it."""
FP8_BUFFERS = ("w_fwd", "s_fwd", "w_bwd", "s_bwd")
"""The buffers of a `Float8FrozenLinear`: the two e4m3 copies of the weight and their fp32 row scales."""
FP8_MIN_CAPABILITY = (8, 9)
"""CUDA compute capability of the first GPUs with FP8 tensor cores (Ada; Hopper is 9.0, Blackwell 10.0)."""
BF16_EDGE_LAYERS = 1
"""Decoder layers at each end of the stack whose linears stay bf16 (as Megatron-Core's `--first-last-layers-bf16`):
the first layer sees the raw embeddings and the last feeds the loss, where FP8 rounding is least diluted. Measured at
8B (200 LoRA steps of learnable rows, one H200): every layer in FP8 ended 1.05% above bf16's eval loss, this
0.01-0.09% (two runs), at the same speed (16,029 and 16,390 tokens/s: within run-to-run spread)."""


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """`x` [M, K] -> (e4m3 [M, K], fp32 scales [M, 1]) with x ~ q * scale: each row scaled by its amax / 448."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=AMAX_FLOOR) / E4M3_MAX
    return (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


@torch.library.custom_op("finetune_trainer::fp8_matmul", mutates_args=())
def fp8_matmul(aq: Tensor, a_scale: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    """`aq` [M, K] e4m3 with `a_scale` [M, 1] times `w`^T ([N, K] e4m3, row-major, `w_scale` [N]) -> [M, N] bf16.

    Opaque to torch.compile, so `_scaled_mm` gets its operands as laid out here (`w^T` a column-major view of the
    row-major copy, rows made row-major first: a gradient can arrive broadcast, with stride 0)."""
    return torch._scaled_mm(
        aq.contiguous(), w.t(), scale_a=a_scale.contiguous(), scale_b=w_scale.view(1, -1), out_dtype=torch.bfloat16
    )


@fp8_matmul.register_fake
def _fp8_matmul_shape(aq: Tensor, a_scale: Tensor, w: Tensor, w_scale: Tensor) -> Tensor:
    return aq.new_empty((aq.shape[0], w.shape[0]), dtype=torch.bfloat16)


@torch.library.custom_op("finetune_trainer::fp8_linear", mutates_args=())
def fp8_linear(
    x: Tensor, xq: Tensor, x_scale: Tensor, w_fwd: Tensor, s_fwd: Tensor, w_bwd: Tensor, s_bwd: Tensor
) -> Tensor:
    """y = x W^T in FP8, from `x`'s e4m3 rows `xq` and their scales (computed by the caller, so that torch.compile
    fuses the quantization into the kernels before it); `x` itself only carries the autograd edge: its gradient is
    dX = dY W, from `w_bwd` (`_fp8_linear_backward`). `x` [M, K] with M a multiple of 16."""
    y: Tensor = fp8_matmul(xq, x_scale, w_fwd, s_fwd)
    return y


@fp8_linear.register_fake
def _fp8_linear_shape(
    x: Tensor, xq: Tensor, x_scale: Tensor, w_fwd: Tensor, s_fwd: Tensor, w_bwd: Tensor, s_bwd: Tensor
) -> Tensor:
    return x.new_empty((x.shape[0], w_fwd.shape[0]), dtype=torch.bfloat16)


def _fp8_linear_setup(ctx: Any, inputs: tuple[Tensor, ...], output: Tensor) -> None:
    x, _xq, _x_scale, _w_fwd, _s_fwd, w_bwd, s_bwd = inputs
    ctx.save_for_backward(w_bwd, s_bwd)
    ctx.x_dtype = x.dtype


def _fp8_linear_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    """dX = dY W in FP8: dY quantized per row (traced, so fused), times `w_bwd`; no gradient for anything else."""
    w_bwd, s_bwd = ctx.saved_tensors
    gq, g_scale = quantize_rows(grad)
    return (fp8_matmul(gq, g_scale, w_bwd, s_bwd).to(ctx.x_dtype), None, None, None, None, None, None)


fp8_linear.register_autograd(_fp8_linear_backward, setup_context=_fp8_linear_setup)


def fp8_linear_rows(x: Tensor, w_fwd: Tensor, s_fwd: Tensor, w_bwd: Tensor, s_bwd: Tensor) -> Tensor:
    """`x` [M, K] times W^T through `fp8_linear`, in `x`'s dtype: rows padded to a multiple of 16 and back.

    Padded always (by 0 rows when M is a multiple of 16), without a branch on M: under torch.compile with a dynamic
    token count a branch would guard on M % 16 and compile the layer again when it changes; inductor fuses the
    padding into the quantization kernel."""
    m = x.shape[0]
    xp = torch.nn.functional.pad(x, (0, 0, 0, -m % ROW_MULTIPLE))
    xq, x_scale = quantize_rows(xp.detach())  # not differentiable: the gradient goes through `xp`
    y: Tensor = fp8_linear(xp, xq, x_scale, w_fwd, s_fwd, w_bwd, s_bwd)[:m]
    return y if y.dtype == x.dtype else y.to(x.dtype)


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(w_fwd [out, in], its scales [out], w_bwd [in, out], its scales [in]) of a weight [out, in]: e4m3 and fp32."""
    w_fwd, s_fwd = quantize_rows(weight)
    w_bwd, s_bwd = quantize_rows(weight.t().contiguous())
    return w_fwd, s_fwd.flatten(), w_bwd, s_bwd.flatten()


class Float8FrozenLinear(nn.Module):
    """A frozen `nn.Linear` whose matmuls run in FP8: e4m3 copies of W for the forward and the input gradient,
    row-wise fp32 scales, the bias (if any) kept in its own dtype. Built with `from_linear`; has no weight."""

    in_features: int
    out_features: int
    w_fwd: Tensor
    s_fwd: Tensor
    w_bwd: Tensor
    s_bwd: Tensor
    bias: nn.Parameter | None

    def __init__(self, w_fwd: Tensor, s_fwd: Tensor, w_bwd: Tensor, s_bwd: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = w_fwd.shape
        self.register_buffer("w_fwd", w_fwd, persistent=False)
        self.register_buffer("s_fwd", s_fwd.float(), persistent=False)
        self.register_buffer("w_bwd", w_bwd, persistent=False)
        self.register_buffer("s_bwd", s_bwd.float(), persistent=False)
        self.bias = nn.Parameter(bias.detach(), requires_grad=False) if bias is not None else None

    def _apply(self, fn: Any, recurse: bool = True) -> Float8FrozenLinear:
        """Whole-module conversions (`module.to(device)`, DeepSpeed's `module.bfloat16()`) move the FP8 copies and
        their scales but never cast them: a bf16 "copy" of an e4m3 weight would be neither."""
        kept = {name: getattr(self, name) for name in FP8_BUFFERS}
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        for name, before in kept.items():
            after = getattr(self, name)
            if after.dtype != before.dtype:
                setattr(self, name, before.to(after.device))
        return self

    @classmethod
    def from_linear(cls, linear: nn.Linear, device: torch.device | None = None) -> Float8FrozenLinear:
        """Quantize `linear`'s weight (on `device`, default its own) into a new module; `linear` is left as it is."""
        weight = linear.weight.detach()
        if device is not None:
            weight = weight.to(device)
        bias = linear.bias.detach().to(weight.device) if linear.bias is not None else None
        return cls(*quantize_weight(weight), bias)

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        y = fp8_linear_rows(x.reshape(-1, self.in_features), self.w_fwd, self.s_fwd, self.w_bwd, self.s_bwd)
        out: Tensor = y.reshape(*lead, self.out_features)
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, e4m3"


def fp8_capable(shape: tuple[int, int]) -> bool:
    """Whether `_scaled_mm` takes a weight of this [out, in] shape: both dimensions multiples of 16."""
    return all(n % ROW_MULTIPLE == 0 for n in shape)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a (PEFT-wrapped) causal LM: the modules of the `ModuleList` named `layers`."""
    found: list[nn.Module] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] == "layers":
            found += list(module)
    return found


def apply_fp8(model: nn.Module, device: torch.device | None = None, *, edge_layers: int | None = None) -> int:
    """Swap every frozen `nn.Linear` inside the decoder layers (LoRA's `base_layer`s, and plain frozen linears
    there) for a `Float8FrozenLinear`, quantized on `device` (default: where each weight is); returns how many.

    Run after PEFT wrapped the model and before the first step (torch.compile traces at the first forward). The
    adapter's own linears (trainable), weights whose shape `_scaled_mm` refuses and the `edge_layers` first and
    last decoder layers (default `BF16_EDGE_LAYERS`) are left alone."""
    edge = BF16_EDGE_LAYERS if edge_layers is None else edge_layers
    layers = _decoder_layers(model)
    replaced: list[str] = []
    names = {id(m): n for n, m in model.named_modules()}
    for layer in layers[edge : len(layers) - edge]:
        for parent in list(layer.modules()):
            for child_name, child in list(parent.named_children()):
                if type(child) is not nn.Linear or child.weight.requires_grad:
                    continue
                if not fp8_capable((child.out_features, child.in_features)):
                    continue
                setattr(parent, child_name, Float8FrozenLinear.from_linear(child, device))
                child.weight = None  # type: ignore[assignment]  # free the bf16 weight now, not at the end
                replaced.append(f"{names[id(parent)]}.{child_name}")
    ignored = list(getattr(model, "_ddp_params_and_buffers_to_ignore", []))
    model._ddp_params_and_buffers_to_ignore = ignored + [f"{n}.{b}" for n in replaced for b in FP8_BUFFERS]  # type: ignore[assignment]
    log.info("fp8: %d linear layers of the frozen base in FP8 (e4m3, row-wise scales), %d decoder layers at each "
             "end in bf16", len(replaced), edge)
    return len(replaced)


def fp8_problem(
    *, cuda_available: bool, device: str = "cuda:0", name: str = "", capability: tuple[int, int] = (0, 0)
) -> str | None:
    """Why `training.precision: fp8` cannot run here (no CUDA device, or `device` has no FP8 matmuls), else None."""
    needs = "training.precision: fp8 needs FP8 matmuls (compute capability 8.9 or newer: Ada, Hopper, Blackwell)"
    fix = "set training.precision: default, or run the job on such GPUs"
    if not cuda_available:
        return f"{needs}; this machine has no CUDA device: {fix}"
    if capability < FP8_MIN_CAPABILITY:
        return f"{needs}; {device} is {name} ({capability[0]}.{capability[1]}): {fix}"
    return None


def fp8_config_problem(*, zero_stage: int) -> str | None:
    """Why an fp8 run cannot start here, else None: ZeRO-3 (which the API refuses too, for a trainer.json written by
    hand), or `fp8_problem` for this process's GPU. That is the one its local rank will use: asking about it
    touches no other GPU (every rank asking about cuda:0 could leave a CUDA context on it)."""
    if zero_stage == 3:
        return "training.precision: fp8 needs ZeRO stage 0, 1 or 2 (ZeRO-3 shards the base weights fp8 replaces)"
    if not torch.cuda.is_available():
        return fp8_problem(cuda_available=False)
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    major, minor = torch.cuda.get_device_capability(index)
    return fp8_problem(
        cuda_available=True, device=f"cuda:{index}", name=torch.cuda.get_device_name(index), capability=(major, minor)
    )
