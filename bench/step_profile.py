"""Where a training step's GPU time goes: torch.profiler over a few steps, kernels grouped by what they do.

Used by `ours_timed.py` when `FTJOB_BENCH_PROFILE=FIRST,LAST` (1-based optimizer steps, profiled inclusive; pick
steps after the compile warm-up). Writes `profile_<job>.txt` (the grouped table, then torch's own per-op table)
beside the results and returns the grouped numbers for the job's result record.

Groups, by kernel name (cuBLAS/CUTLASS names differ by GPU and library version, so the rules are substrings):
matmul (cuBLAS, cuBLASLt `nvjet`, CUTLASS, `_scaled_mm`), attention (flash / varlen / SDPA kernels), fused by
inductor (`triton_*` kernels torch.compile generates: norms, RoPE, SwiGLU, LoRA dropout and casts fused), loss
(cross-entropy and log-softmax), optimizer (multi-tensor / fused Adam), copies (memcpy, memset, copy and cast
kernels), other. `gpu busy` is the kernels' summed time per step; `idle` = wall - busy: time the GPU waited
for the CPU (launches, Python, synchronisation).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("flash", "fmha", "varlen", "attention", "attn")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "scaled_mm", "_mm_", "matmul", "splitk")),
    ("fused by inductor", ("triton_",)),
    ("loss", ("cross_entropy", "log_softmax", "nll_loss", "softmax")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("copies", ("memcpy", "memset", "copy", "cast", "fill")),
)


def group_of(kernel: str) -> str:
    """The group a kernel name belongs to (first match in `GROUPS`), else "other"."""
    name = kernel.lower()
    for group, needles in GROUPS:
        if any(needle in name for needle in needles):
            return group
    return "other"


def summarize(kernels: Iterable[tuple[str, float]], *, steps: int, wall_s: float) -> dict[str, Any]:
    """(kernel name, seconds) pairs of `steps` profiled steps taking `wall_s` -> per-step seconds by group, busy,
    idle, and the 15 costliest kernels."""
    by_group: dict[str, float] = {}
    by_kernel: dict[str, float] = {}
    for name, seconds in kernels:
        by_group[group_of(name)] = by_group.get(group_of(name), 0.0) + seconds
        by_kernel[name] = by_kernel.get(name, 0.0) + seconds
    busy = sum(by_group.values())
    per_step = max(steps, 1)
    return {
        "steps": steps,
        "wall_s_per_step": wall_s / per_step,
        "gpu_busy_s_per_step": busy / per_step,
        "idle_s_per_step": max(wall_s - busy, 0.0) / per_step,
        "groups_s_per_step": {g: s / per_step for g, s in sorted(by_group.items(), key=lambda kv: -kv[1])},
        "top_kernels_s_per_step": [
            [name[:160], s / per_step] for name, s in sorted(by_kernel.items(), key=lambda kv: -kv[1])[:15]
        ],
    }


def render(summary: dict[str, Any]) -> str:
    """The grouped table as text (the head of profile_<job>.txt)."""
    wall = summary["wall_s_per_step"]
    lines = [
        f"per step: wall {wall * 1e3:.1f} ms, gpu busy {summary['gpu_busy_s_per_step'] * 1e3:.1f} ms, "
        f"idle {summary['idle_s_per_step'] * 1e3:.1f} ms ({summary['steps']} steps profiled)"
    ]
    for group, seconds in summary["groups_s_per_step"].items():
        lines.append(f"  {group:<18} {seconds * 1e3:8.1f} ms  {100 * seconds / wall:5.1f}% of the step")
    lines.append("costliest kernels (ms per step):")
    for name, seconds in summary["top_kernels_s_per_step"]:
        lines.append(f"  {seconds * 1e3:8.2f}  {name}")
    return "\n".join(lines)


def kernel_times(prof: Any) -> list[tuple[str, float]]:
    """(name, seconds) of every GPU kernel a finished torch.profiler.profile recorded."""
    from torch.autograd import DeviceType

    events = prof.profiler.kineto_results.events()
    return [(e.name(), e.duration_ns() / 1e9) for e in events if e.device_type() == DeviceType.CUDA]
