"""Throughput and memory benchmark: the seed recipe and our trainer, side by side, interleaved, in one GPU run.

    python3 bench/run_bench.py --plan perf --out $OUT --budget 560

Each job is one of
  seed   bench/seed/seed_baseline.py under `accelerate launch --config_file bench/seed/configs/<cfg>.yaml`, exactly as
         bench/seed/run_seed_baseline.sh runs it;
  ours   a FineTuneJob rendered by finetune_operator.render.render_all (zeroStage auto unless set), its node commands
         run as local "nodes", the trainer entry replaced by bench/ours_timed.py (same trainer, plus the timer);
  par    several single-GPU jobs at once on disjoint GPUs (lever comparisons);
  cmd    any command (versions, matmul ceiling, GPU tests).
Results: $OUT/results.jsonl (one line per run: the seed schema, plus our plan estimate for `ours`), $OUT/log.txt.
Jobs run in order while the time budget lasts; one that cannot fit its minimum time is recorded as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / p) for p in ("api", "operator", "trainer")]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as H  # noqa: E402

MODELS = Path(os.environ.get("BENCH_MODELS", "/tmp/bench/models"))
DATA = Path(os.environ.get("BENCH_DATA", "/tmp/bench/data"))
WORK = Path(os.environ.get("BENCH_WORK", "/tmp/bench/work"))

SHAPE_8B = {"numParameters": 8030261248, "hiddenSize": 4096, "numLayers": 32, "intermediateSize": 14336,
            "vocabSize": 128256, "numAttentionHeads": 32, "numKeyValueHeads": 8}


def ours_spec(name: str, *, gpus: int = 2, nodes: int = 1, gc: bool | None = False, zero: Any = "auto", steps: int = 12,
              model: str = "llama3-8b", shape: dict | None = None, extra: dict | None = None) -> dict[str, Any]:
    """The seed benchmark's setting as a FineTuneJob: LoRA r=8 all-linear, seq 2048, 4 x 2048 tokens per GPU per
    step, no accumulation, lr 1e-4 cosine, seed 42, bf16."""
    spec = {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": str(MODELS / model), "attnImplementation": "sdpa", "shape": shape or SHAPE_8B},
            "dataset": {"name": str(DATA / "rand2048"), "splits": ["train"], "textField": "content",
                        "maxSeqLen": 2048, "packing": True},
            "adapter": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.1, "targetModules": "all-linear"},
            "training": {"maxSteps": steps, "learningRate": 1e-4, "lrSchedulerType": "cosine", "weightDecay": 1e-4,
                         "maxGradNorm": 1.0, "perDeviceTrainBatchSize": 4, "gradientAccumulationSteps": 1,
                         "gradientCheckpointing": gc, "useReentrant": False, "mixedPrecision": "bf16", "seed": 42,
                         "loggingSteps": 1, "evalStrategy": "no", "saveStrategy": "no"},
            "distributed": {"nodes": nodes, "gpusPerNode": gpus, "gpuMemoryGiB": 140,
                            "deepspeed": {"zeroStage": zero},
                            "rendezvous": {"backend": "c10d", "port": H.next_port(), "maxRestarts": 0}},
            "output": {"checkpoints": {"emptyDir": {}}},
        },
    }
    if gc is None:  # as a user writes it: gradientCheckpointing left at its default (auto)
        del spec["spec"]["training"]["gradientCheckpointing"]
    return H.deep_merge(spec, extra or {})


SHAPE_70B = {"numParameters": 68976648192, "hiddenSize": 8192, "numLayers": 80, "intermediateSize": 28672,
             "vocabSize": 32000, "numAttentionHeads": 64, "numKeyValueHeads": 8}
QLORA = {"quantType": "nf4", "doubleQuant": True, "computeDtype": "bfloat16", "storageDtype": "bfloat16"}
# the GPU host's preinstalled transformers (5.17) under every other wheel we install: /tmp/site517 = /tmp/site minus it
STACK_517 = {"PYTHONPATH": "/tmp/site517"}


def seed_job(name: str, cfg: str, args: list[str] | None = None, minimum: int = 100, limit: int = 200,
             env: dict[str, str] | None = None, gpus: str | None = None, procs: int | None = None) -> dict:
    """`gpus`/`procs`: run on these GPUs with this many processes (accelerate's --num_processes overrides the
    config's 2), e.g. the seed recipe on one GPU."""
    return {"type": "seed", "name": name, "config": cfg, "args": args or [], "min": minimum, "max": limit,
            "env": env or {}, "gpus": gpus, "procs": procs}


def ours_job(name: str, levers: str = "", minimum: int = 70, limit: int = 200, note: str = "", gpu_offset: int = 0,
             env: dict[str, str] | None = None, **spec_kw: Any) -> dict:
    return {"type": "ours", "name": name, "spec": ours_spec(name, **spec_kw), "levers": levers, "min": minimum,
            "max": limit, "note": note, "gpu_offset": gpu_offset, "env": env or {}}


def plan_perf() -> list[dict]:
    best = "varlen,liger,fused_adamw"
    return [
        seed_job("A_zero3", "zero3"),
        ours_job("ours_best", best, note="DDP (planner: auto), no checkpointing, " + best),
        {"type": "par", "name": "pair_attention", "min": 80, "max": 200, "jobs": [
            ours_job("ours1g_dense", "", gpus=1, note="1 GPU, no checkpointing, TRL bfd + sdpa dense packed mask"),
            ours_job("ours1g_varlen", "varlen", gpus=1, gpu_offset=1, note="1 GPU, no checkpointing, varlen"),
        ]},
        {"type": "par", "name": "pair_kernels", "min": 80, "max": 240, "jobs": [
            ours_job("ours1g_varlen_liger", "varlen,liger", gpus=1, note="1 GPU, varlen + liger"),
            ours_job("ours1g_varlen_compile", "varlen,compile", gpus=1, gpu_offset=1,
                     note="1 GPU, varlen + torch.compile per decoder layer"),
        ]},
        seed_job("A_zero3_rep2", "zero3"),
        ours_job("ours_best_rep2", best, note="DDP (planner: auto), no checkpointing, " + best),
        {"type": "par", "name": "pair_gc", "min": 80, "max": 200, "jobs": [
            ours_job("ours1g_varlen_liger_gc", "varlen,liger", gpus=1, gc=True,
                     note="1 GPU, varlen + liger, checkpointing on (non-reentrant)"),
            ours_job("ours1g_varlen_liger_fused", "varlen,liger,fused_adamw", gpus=1, gpu_offset=1,
                     note="1 GPU, varlen + liger + fused AdamW"),
        ]},
        {"type": "cmd", "name": "gpu_tests", "argv": [H.PY, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                                       "tests/gpu", "-m", "gpu", "-x"], "min": 30, "max": 120,
         "env": {"CUDA_VISIBLE_DEVICES": "0"}},
    ]


def plan_memory() -> list[dict]:
    """Peak memory of our trainer under each strategy (8B shape, 4 steps), for the planner comparison."""
    lv = "varlen,liger"
    q = {"spec": {"model": {"quantization": {"quantType": "nf4", "doubleQuant": True, "computeDtype": "bfloat16",
                                             "storageDtype": "bfloat16"}}}}
    return [
        ours_job("mem_zero3_gc", lv, zero=3, gc=True, steps=4, note="ZeRO-3, checkpointing (the recipe's strategy)"),
        ours_job("mem_zero2_gc", lv, zero=2, gc=True, steps=4, note="ZeRO-2, checkpointing"),
        ours_job("mem_ddp_gc", lv, zero=0, gc=True, steps=4, note="DDP, checkpointing"),
        ours_job("mem_zero3_offload_gc", lv, zero=3, gc=True, steps=4, extra={"spec": {"distributed": {
            "deepspeed": {"offloadOptimizer": "cpu"}}}}, note="ZeRO-3 + optimizer offload to CPU, checkpointing"),
        ours_job("mem_qlora_zero3_gc", lv, zero=3, gc=True, steps=4, extra=q, minimum=120, limit=260,
                 note="QLoRA nf4 (bf16 storage) + ZeRO-3, checkpointing"),
    ]


def plan_cpu_smoke() -> list[dict]:
    tiny = {"numParameters": 206000, "hiddenSize": 64, "numLayers": 2, "intermediateSize": 128, "vocabSize": 400,
            "numAttentionHeads": 4, "numKeyValueHeads": 4}
    extra = {"spec": {"model": {"name": "builtin:tiny-llama"},
                      "dataset": {"name": "builtin:tiny-chat", "maxSeqLen": 128},
                      "training": {"mixedPrecision": "no", "perDeviceTrainBatchSize": 2},
                      "distributed": {"processesPerNode": 1}}}
    return [ours_job("cpu_ours", "varlen,fused_adamw", gpus=0, nodes=2, zero=3, steps=4, shape=tiny, extra=extra,
                     minimum=10, limit=300),
            ours_job("cpu_ours_1p", "varlen", gpus=0, nodes=1, zero=0, steps=4, shape=tiny, extra=extra,
                     minimum=10, limit=300)]


def plan_final() -> list[dict]:
    """Run 2: the headline comparison (seed, ours, seed, ours), then peak memory of our trainer per strategy on
    the 8B shape while the tiny-model correctness suite (bench/correctness.py) runs beside it."""
    final = "varlen,compile,fused_adamw"
    note = "DDP (planner: auto), no checkpointing, " + final
    return [
        seed_job("A_zero3", "zero3"),
        ours_job("ours_final", final, note=note),
        seed_job("A_zero3_rep2", "zero3"),
        ours_job("ours_final_rep2", final, note=note),
        {"type": "bg_start", "name": "correctness", "argv": [H.PY, str(H.REPO / "bench/correctness.py")],
         "pass_budget": True},
        *[j for j in plan_memory() if j["name"] not in ("mem_ddp_gc", "mem_zero3_offload_gc")],
        *[j for j in plan_memory() if j["name"] == "mem_zero3_offload_gc"],
        {"type": "bg_wait", "name": "correctness"},
    ]


def plan_last() -> list[dict]:
    """Run 3: what run 2 could not finish (its memory runs lost their timer: the trainer now imports
    trl.trainer.sft_trainer.SFTTrainer): ZeRO-3 and QLoRA memory on the 8B shape beside the QLoRA and
    kill-and-resume correctness runs."""
    mem = {j["name"]: j for j in plan_memory()}
    return [
        {"type": "bg_start", "name": "correctness", "argv": [H.PY, str(H.REPO / "bench/correctness.py"), "--only",
                                                             "c_qlora_zero3,c_zero3_resume"], "pass_budget": True},
        mem["mem_zero3_gc"],
        {**mem["mem_qlora_zero3_gc"], "min": 60},
        mem["mem_zero2_gc"],
        {"type": "bg_wait", "name": "correctness"},
    ]


def plan_integrated() -> list[dict]:
    """Run 4: the trainer choosing its own levers (speed.resolve_levers inside the trainer, no FTJOB_SPEED),
    once, beside one seed run: checks that the integrated path is the measured one."""
    return [
        ours_job("ours_auto", "auto", note="DDP (planner: auto), no checkpointing, levers chosen by the trainer"),
        seed_job("A_zero3", "zero3"),
    ]


def plan_release() -> list[dict]:
    """Run 5: why the recipe's 70B ZeRO-3 job gathers the whole model (bench/seed/BASELINE.md, runs 4-7). The seed
    script on a 70B-wide model of 8 and of 16 layers (batch 1), under the GPU host's preinstalled transformers 5.17 and
    our pinned 5.24, interleaved: if gathered parameters are never released, the peak grows by a whole bf16 layer
    (1.7 GB) per layer, else by its shard only. Beside it, the tiny-model correctness runs still missing (CPU offload;
    resume of ZeRO-2, ZeRO-3 + offload, QLoRA)."""
    w70 = ["--hidden", "8192", "--intermediate", "28672", "--heads", "64", "--kv-heads", "8", "--vocab", "32000",
           "--bsz", "1", "--steps", "4", "--measure", "3"]
    missing = "c_zero3_offload,c_zero3_offload_resume,c_zero2_resume,c_qlora_zero3_resume"
    return [
        {"type": "bg_start", "name": "correctness", "argv": [H.PY, str(H.REPO / "bench/correctness.py"), "--only",
                                                             missing], "pass_budget": True},
        *[seed_job(f"rel_tf{v}_{n}l", "zero3", [*w70, "--layers", str(n)], minimum=50, limit=140,
                   env=STACK_517 if v == "517" else None)
          for n in (8, 16) for v in ("517", "524")],
        {"type": "bg_wait", "name": "correctness"},
    ]


def plan_q70() -> list[dict]:
    """Run 8: run 7's QLoRA job again (its fp8 cast shim indexed a lazy safetensors slice; fixed)."""
    return plan_big70()[:1]


def plan_big70() -> list[dict]:
    """Run 6: the 70B shape (fp8-stored random checkpoint, cast to bf16 on load) with our trainer on 2 GPUs:
    QLoRA + ZeRO-3 at the seed's batch (2 x 2048), then LoRA + ZeRO-3 at the seed's batch (8 x 2048) with the
    checkpointed activations offloaded to host memory. Run 6 ran this with plain loading: both timed out loading
    (fp8 -> bf16 cast on the CPU); run 7 adds the bench shims of ours_timed.py."""
    data = {"dataset": {"name": str(DATA / "rand2048_v32k")}}
    return [
        ours_job("q70_zero3_b2", "auto", zero=3, gc=True, steps=3, model="llama2-70b-fp8", shape=SHAPE_70B,
                 minimum=150, limit=230, env={"FTJOB_BENCH_FP8_CAST": "1"}, note="70B QLoRA nf4 + ZeRO-3, 2 x 2048 per GPU, checkpointing",
                 extra={"spec": {**data, "model": {"quantization": QLORA},
                                 "training": {"perDeviceTrainBatchSize": 2}}}),
        ours_job("l70_zero3_b8_actoff", "auto", zero=3, gc=True, steps=3, model="llama2-70b-fp8", shape=SHAPE_70B,
                 minimum=150, limit=330, env={"FTJOB_BENCH_RANDOM_INIT": "1"},
                 note="70B LoRA + ZeRO-3 (built under zero.Init), 8 x 2048 per GPU, checkpoints offloaded to host",
                 extra={"spec": {**data, "training": {"perDeviceTrainBatchSize": 8, "offloadActivations": True}}}),
    ]


def q70_job(name: str, *, load: str = "partitioned", segments: bool = True, offload_activations: bool = False,
            overrides: dict | None = None, steps: int = 3, note: str = "") -> dict:
    """Runs 10-12: the 70B QLoRA job of run 8 (nf4 + double quant, bf16 storage, ZeRO-3, checkpointing, 2 x 2048 per
    GPU) with the memory levers one at a time: `load` "partitioned" (the trainer's default since 2026-11-30: each 4-bit
    weight partitioned as it is quantized) or "whole" (FTJOB_ZERO3_4BIT_LOAD=whole: transformers' own load, as in
    run 8); `segments` expandable allocator segments (the trainer's default since 2026-11-30) or
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False (as in run 8); `offload_activations` the spec's
    training.offloadActivations (checkpointed hidden states in host memory)."""
    env = {"FTJOB_BENCH_FP8_CAST": "1"}
    if load == "whole":
        env["FTJOB_ZERO3_4BIT_LOAD"] = "whole"
    if not segments:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
    training: dict[str, Any] = {"perDeviceTrainBatchSize": 2}
    if offload_activations:
        training["offloadActivations"] = True
    spec: dict[str, Any] = {"dataset": {"name": str(DATA / "rand2048_v32k")}, "model": {"quantization": QLORA},
                            "training": training}
    if overrides:
        spec["distributed"] = {"deepspeed": {"overrides": overrides}}
    levers = f"load {load}, expandable segments {'on' if segments else 'off'}" + (
        ", activations offloaded" if offload_activations else "") + (f", overrides {overrides}" if overrides else "")
    return ours_job(name, "auto", zero=3, gc=True, steps=steps, model="llama2-70b-fp8", shape=SHAPE_70B,
                    minimum=140, limit=230, env=env, note=note or f"70B QLoRA + ZeRO-3, 2 x 2048 per GPU: {levers}",
                    extra={"spec": spec})


def plan_q70mem() -> list[dict]:
    """Runs 10-11: the 70B QLoRA memory levers, the likely winner first; run_bench's --only picks."""
    return [
        q70_job("q70_part_seg_actoff", offload_activations=True),
        q70_job("q70_part_seg"),
        q70_job("q70_part", segments=False),
        q70_job("q70_seg", load="whole"),
        q70_job("q70_base", load="whole", segments=False),
        q70_job("q70_part_seg_actoff_rep2", offload_activations=True),
        # run 12: DeepSpeed's ZeRO-3 gradient bucket is reduce_bucket_size (default 5e8) elements, allocated at
        # deepspeed.initialize: 0.93 GiB of bf16 for 0.10B trainable parameters. 67108864 = hidden^2, what
        # transformers' "auto" gives for this model; set through the spec's deepspeed.overrides.
        q70_job("q70_part_seg_actoff_rb", offload_activations=True, overrides=RB, steps=5),
        q70_job("q70_part_seg_actoff_rb_rep2", offload_activations=True, overrides=RB, steps=5),
        q70_job("q70_part_seg_rb", overrides=RB),
    ]


RB = {"zero_optimization": {"reduce_bucket_size": 67108864}}

DEFAULT_NOTE = "1 GPU, a job as a user writes it: gradientCheckpointing left at its default (auto), no FTJOB_SPEED"


def default_job(name: str, **kw: Any) -> dict:
    """The default job: the seed benchmark's workload as a FineTuneJob with no speed field and no FTJOB_SPEED, so
    the planner decides checkpointing and the trainer its levers."""
    return ours_job(name, "auto", gpus=1, gc=None, note=kw.pop("note", DEFAULT_NOTE), **kw)


def seed_1gpu(name: str) -> dict:
    """The seed recipe (ZeRO-3 accelerate config, checkpointing) on one GPU: one process."""
    return seed_job(name, "zero3", gpus="0", procs=1)


def plan_auto1g() -> list[dict]:
    """Run 13: gradientCheckpointing auto on one GPU. The default job interleaved with the seed recipe (seed,
    default, seed, default, seed), then the planner's partial choice (a job told its GPU has 60 GiB, so auto
    checkpoints some layers) and checkpointing on every layer, for peak memory against the plan."""
    return [
        seed_1gpu("A_zero3_1g"),
        default_job("ours_default"),
        seed_1gpu("A_zero3_1g_rep2"),
        default_job("ours_default_rep2"),
        seed_1gpu("A_zero3_1g_rep3"),
        default_job("ours_auto_partial60", steps=10, minimum=60,
                    note="1 GPU, gradientCheckpointing auto with gpuMemoryGiB 60: the planner checkpoints some layers",
                    extra={"spec": {"distributed": {"gpuMemoryGiB": 60}}}),
        ours_job("ours_gc_all", "auto", gpus=1, gc=True, steps=10, minimum=60,
                 note="1 GPU, gradientCheckpointing true (every layer), levers chosen by the trainer"),
    ]


LOGNORMAL = {"spec": {"dataset": {"name": str(DATA / "lognormal360")}}}


def plan_stalls() -> list[dict]:
    """Run 14: 200 steps of the default job on documents of lognormal lengths (median 360 tokens), so every packed
    batch has another token count and number of documents: torch.compile with PyTorch's automatic dynamic shapes
    (recompile once a dimension is seen to change) vs every dimension dynamic from the first step."""
    note = "1 GPU, default job, 200 steps, lognormal document lengths (median 360), compile dynamic="
    return [
        default_job("stall_dyn_auto", steps=200, minimum=150, limit=290, extra=LOGNORMAL, note=note + "None",
                    env={"FTJOB_BENCH_MEASURE": "190"}),
        default_job("stall_dyn_true", steps=200, minimum=150, limit=290, extra=LOGNORMAL, note=note + "True",
                    env={"FTJOB_BENCH_MEASURE": "190", "FTJOB_BENCH_COMPILE_DYNAMIC": "1"}),
    ]


def plan_fast1g() -> list[dict]:
    """One GPU, after the compiled path lost its graph breaks and the heap is frozen: the default job interleaved
    with the seed recipe (seed, default, seed, default), the second default job profiled at steps 4-5 (step_profile.py;
    its tokens/s come from steps 7-14), then 200 steps of the default job on lognormal documents with per-step
    diagnostics (GC pauses, compiled graphs, allocator retries; TORCH_LOGS=recompiles names any recompile)."""
    note = "1 GPU, default job, 200 steps, lognormal document lengths (median 360), packed batches padded to 64"
    return [
        seed_1gpu("A_zero3_1g"),
        default_job("ours_default"),
        seed_1gpu("A_zero3_1g_rep2"),
        default_job("ours_default_prof", steps=14, env={"FTJOB_BENCH_PROFILE": "4,5"},
                    note=DEFAULT_NOTE + "; torch.profiler over steps 4-5"),
        default_job("stall_default", steps=200, minimum=150, limit=290, extra=LOGNORMAL, note=note,
                    env={"FTJOB_BENCH_MEASURE": "190", "TORCH_LOGS": "recompiles"}),
    ]


ARITHMETIC = {"spec": {
    "dataset": {"name": str(DATA / "arith2048"), "splits": ["train", "test"]},
    "training": {"evalStrategy": "steps", "evalSteps": 200, "perDeviceEvalBatchSize": 4, "loggingSteps": 1},
}}


def quality_job(name: str, precision: str, profile: str = "", env: dict[str, str] | None = None) -> dict:
    """The default job for 200 steps on the learnable arithmetic rows (2048 tokens each, as the bench rows), eval
    on the held-out split at step 200: train/eval loss of bf16 vs fp8, and the steady tokens/s of both; `profile`
    names optimizer steps to profile (`FIRST,LAST`, outside the measured last 150)."""
    extra = H.deep_merge(ARITHMETIC, {"spec": {"training": {"precision": precision}}})
    env = {"FTJOB_BENCH_MEASURE": "150"} | ({"FTJOB_BENCH_PROFILE": profile} if profile else {}) | (env or {})
    return default_job(name, steps=200, minimum=150, limit=260, extra=extra, env=env,
                       note=f"1 GPU, default job, training.precision {precision}, 200 steps of arithmetic rows")


def plan_fp8() -> list[dict]:
    """One GPU: training.precision fp8 against the default (bf16) job on the same 200 steps of learnable data,
    between two seed-recipe jobs (their tokens/s for the ratio of this run)."""
    return [
        seed_1gpu("A_zero3_1g"),
        quality_job("q_bf16", "default"),
        quality_job("q_fp8", "fp8"),
        seed_1gpu("A_zero3_1g_rep2"),
    ]


def plan_fp8stall() -> list[dict]:
    """One GPU, one call: bf16 and fp8 over the same 200 steps of arithmetic rows (loss and tokens/s), then 200
    steps of the default job on lognormal documents with the token count dynamic from the first compile."""
    note = "1 GPU, default job, 200 steps, lognormal document lengths (median 360), tokens dynamic from step 1"
    return [
        quality_job("q_bf16", "default"),
        quality_job("q_fp8", "fp8", profile="20,21"),
        default_job("stall_dyn_tokens", steps=200, minimum=150, limit=260, extra=LOGNORMAL, note=note,
                    env={"FTJOB_BENCH_MEASURE": "190", "TORCH_LOGS": "recompiles"}),
    ]


def plan_fp8edges() -> list[dict]:
    """One GPU: run 18 skipped the 200 lognormal steps (out of budget): those first, then fp8 with the first and
    last decoder layers kept bf16 (run 18's fp8 eval loss was 1.05% above bf16's, the goal 1%)."""
    stall = plan_fp8stall()[-1]
    return [stall, quality_job("q_fp8_edges1", "fp8", env={"FTJOB_BENCH_FP8_EDGES": "1"})]


NF4_70B = "llama2-70b-nf4"  # make_models.py --nf4-storage: the 70B shape stored as the recipe's QLoRA quantizes it
DATA_V32K = {"dataset": {"name": str(DATA / "rand2048_v32k")}}


def seed_q70(name: str) -> dict:
    """The seed recipe's QLoRA job on one GPU: the guide's QLoRA loading (`--qlora`: its BitsAndBytesConfig,
    reentrant checkpointing) under the ZeRO-3 accelerate config, 2 x 2048 tokens per step as the guide's command
    (without its accumulation of 2: the recipe's configs here fix DeepSpeed's accumulation at 1)."""
    args = ["--model-path", str(MODELS / NF4_70B), "--qlora", "--bsz", "2", "--steps", "6", "--measure", "4"]
    return seed_job(name, "zero3", args, minimum=170, limit=260, gpus="0", procs=1)


def ours_q70(name: str, batch: int) -> dict:
    """Our default job on the same checkpoint and rows: QLoRA as the recipe sets it, nothing else but the batch;
    the planner picks the strategy (one GPU: no ZeRO) and how many layers to checkpoint."""
    spec = {"spec": {**DATA_V32K, "model": {"quantization": QLORA}, "training": {"perDeviceTrainBatchSize": batch}}}
    return default_job(name, steps=8, minimum=110, limit=220, model=NF4_70B, shape=SHAPE_70B, extra=spec,
                       note=f"1 GPU, 70B QLoRA default job, {batch} x 2048 tokens per step, checkpointing auto")


def plan_q70_1g() -> list[dict]:
    """One GPU, 70B QLoRA: the seed recipe's QLoRA job, then ours at the recipe's 2 x 2048 tokens per step (the
    planner checkpoints some layers) and at 1 x 2048 (none), then the recipe again if the budget allows."""
    return [seed_q70("S_q70_1g"), ours_q70("ours_q70_b2", 2), ours_q70("ours_q70_b1", 1), seed_q70("S_q70_1g_rep2")]


def plan_cudagraphs() -> list[dict]:
    """One GPU: the compiled decoder layers captured in CUDA graphs (torch.compile mode reduce-overhead) against
    the launch gaps run 15's and 18's profiles show as GPU idle (86 ms of 625, 69 of 520): the default job and fp8
    with it, then the seed recipe and the default job without it, for the ratio of this run."""
    cg = {"FTJOB_BENCH_COMPILE_MODE": "reduce-overhead"}
    fp8 = {"spec": {"training": {"precision": "fp8"}}}
    return [
        default_job("ours_default_cg", steps=30, env=cg, note=DEFAULT_NOTE + "; compiled layers in CUDA graphs"),
        default_job("ours_fp8_cg", steps=30, env=cg, extra=fp8,
                    note="1 GPU, default job, training.precision fp8; compiled layers in CUDA graphs"),
        seed_1gpu("A_zero3_1g"),
        default_job("ours_default", steps=30),
    ]


PLANS = {"cudagraphs": plan_cudagraphs, "q70_1g": plan_q70_1g, "fp8edges": plan_fp8edges, "fast1g": plan_fast1g, "fp8": plan_fp8, "fp8stall": plan_fp8stall, "auto1g": plan_auto1g, "stalls": plan_stalls, "q70mem": plan_q70mem, "q70": plan_q70, "release": plan_release, "big70": plan_big70, "integrated": plan_integrated, "perf": plan_perf, "final": plan_final, "last": plan_last, "memory": plan_memory, "cpu-smoke": plan_cpu_smoke}


class Runner:
    def __init__(self, out: Path, budget: float) -> None:
        self.out = out
        self.results = out / "results.jsonl"
        self.logf = out / "log.txt"
        self.t0 = time.time()
        self.budget = budget
        self.bg: dict[str, H.Proc] = {}

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} +{time.time() - self.t0:5.0f}s] {msg}"
        print(line, flush=True)
        with open(self.logf, "a") as f:
            f.write(line + "\n")

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)

    # -- job kinds ---------------------------------------------------------------------------------------------
    def start_seed(self, job: dict, gpus: str = "0,1") -> list[H.Proc]:
        port = H.next_port()
        gpus = job.get("gpus") or gpus
        procs = ["--num_processes", str(job["procs"])] if job.get("procs") else []
        argv = [H.PY, "-m", "accelerate.commands.launch", "--config_file",
                str(H.REPO / "bench/seed/configs" / f"{job['config']}.yaml"), "--main_process_port", str(port), *procs,
                str(H.REPO / "bench/seed/seed_baseline.py"), "--name", job["name"], "--results", str(self.results),
                "--outdir", "/tmp/seed_out", *job["args"]]
        env = H.base_env({"CUDA_VISIBLE_DEVICES": gpus, **job.get("env", {})})
        return [H.Proc(argv, env, WORK / job["name"] / "seed.log")]

    def start_ours(self, job: dict) -> tuple[list[H.Proc], H.RenderedRun]:
        wd = WORK / job["name"]
        run = H.render_job(job["spec"], wd, timed=True)
        extra = {"FTJOB_BENCH_NAME": job["name"], "FTJOB_BENCH_RESULTS": str(self.results),
                 "FTJOB_BENCH_NOTE": job.get("note", ""), **job.get("env", {})}
        # explicit levers for every run ("none" for the plain baseline); "auto" leaves the choice to the trainer
        if job.get("levers") != "auto":
            extra["FTJOB_SPEED"] = job.get("levers") or "none"
        p = run.plan
        self.log(f"  {job['name']}: plan ZeRO-{p.strategy.zero_stage}/{p.strategy.offload}, estimate "
                 f"{p.estimate.total_gib:.1f} GiB ({p.reason})")
        return H.start_nodes(run, gpu_offset=job.get("gpu_offset", 0), extra_env=extra), run

    def finish_ours(self, job: dict, run: H.RenderedRun, codes: list[int], wall: float) -> None:
        plan = run.plan
        row = {"name": job["name"], "plan": {"zero_stage": plan.strategy.zero_stage, "offload": plan.strategy.offload,
                                             "estimate_gib": plan.estimate.total_gib,
                                             "parts_gib": {k: v / 2**30 for k, v in plan.estimate.parts.items()},
                                             "reason": plan.reason},
               "rc": codes, "wall_s": wall, "accelerate_yaml": run.files.get("accelerate.yaml"),
               "deepspeed_json": run.files.get("deepspeed.json")}
        H.append_jsonl(self.out / "ours_runs.jsonl", row)

    def run_job(self, job: dict) -> None:
        kind, name = job["type"], job["name"]
        if kind == "bg_start":  # a background command (runs beside the next jobs, e.g. tiny correctness runs)
            self.log(f"BG START {name}")
            argv = [*job["argv"], "--budget", str(int(self.left() - 25))] if job.get("pass_budget") else job["argv"]
            # its own port range: it picks rendezvous ports while our foreground jobs pick theirs
            env = H.base_env({"FTJOB_BENCH_PORT_BASE": "33000", **job.get("env", {})})
            self.bg[name] = H.Proc(argv, env, WORK / name / "bg.log")
            return
        if kind == "bg_wait":
            p = self.bg.pop(name, None)
            if p is not None:
                rc = p.wait(max(self.left() - 5, 1))
                self.log(f"BG END {name} rc={rc}\n{H.tail(p.log_path, 30)}")
                p.close()
            return
        left = self.left()
        if left < job.get("min", 60):
            self.log(f"SKIP {name}: {left:.0f}s of budget left, needs {job.get('min', 60)}s")
            H.append_jsonl(self.results, {"name": name, "ok": False, "error": "skipped: out of time budget"})
            return
        limit = min(job.get("max", 300), left - 5)
        self.log(f"JOB {name} ({kind}) limit {limit:.0f}s")
        t = time.time()
        entries: list[tuple[dict, list[H.Proc], H.RenderedRun | None]] = []
        try:
            if kind == "cmd":
                env = H.base_env(job.get("env"))
                entries.append((job, [H.Proc(job["argv"], env, WORK / name / "cmd.log")], None))
            elif kind == "seed":
                entries.append((job, self.start_seed(job), None))
            elif kind == "ours":
                procs, run = self.start_ours(job)
                entries.append((job, procs, run))
            elif kind == "par":
                for sub in job["jobs"]:
                    if sub["type"] == "ours":
                        procs, run = self.start_ours(sub)
                        entries.append((sub, procs, run))
                    else:
                        entries.append((sub, self.start_seed(sub, gpus=sub.get("gpus", "0")), None))
            for sub, procs, run in entries:
                codes = H.wait_all(procs, limit - (time.time() - t))
                wall = time.time() - t
                self.log(f"END {sub['name']} rc={codes} wall={wall:.0f}s")
                if run is not None:
                    self.finish_ours(sub, run, codes, wall)
                if any(codes) and sub["type"] != "cmd":
                    have = self.results.exists() and f'"name": "{sub["name"]}"' in self.results.read_text()
                    if not have:
                        H.append_jsonl(self.results, {"name": sub["name"], "ok": False,
                                                      "error": f"rc={codes} (124 = timeout)"})
                for p in procs:
                    self.log(f"--- tail {p.log_path}\n{H.tail(p.log_path, 25 if any(codes) else 6)}")
        except Exception as e:
            self.log(f"ERROR {name}: {type(e).__name__}: {e}")
            H.append_jsonl(self.results, {"name": name, "ok": False, "error": f"{type(e).__name__}: {e}"})
        finally:
            for _, procs, _ in entries:
                for p in procs:
                    p.close()
            H.kill_leftovers(self.log)
            time.sleep(2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", action="append", required=True, choices=sorted(PLANS))
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--budget", type=float, default=540)
    ap.add_argument("--only", default=None, help="comma-separated job names")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["OUT"] = str(out.resolve())  # background jobs (correctness.py) write there too
    WORK.mkdir(parents=True, exist_ok=True)
    r = Runner(out, a.budget)
    jobs = [j for p in a.plan for j in PLANS[p]()]
    if a.only:
        keep = set(a.only.split(","))
        jobs = [j for j in jobs if j["name"] in keep]
    r.log(f"plan {a.plan}: {[j['name'] for j in jobs]}")
    for job in jobs:
        r.run_job(job)
    r.log("done")
    # short table last (the reply carries the end of the output)
    if r.results.exists():
        for line in r.results.read_text().splitlines():
            d = json.loads(line)
            tps = d.get("tokens_per_s_per_gpu")
            mem = max((x.get("max_mem_alloc_gib", 0) for x in d.get("ranks", [])), default=0)
            print(f"{d['name']:28s} ok={d.get('ok')} tok/s/GPU={tps if tps is None else round(tps)} "
                  f"step_s={d.get('step_s')} peak_alloc={mem:.1f} {d.get('error', '')[:120]}")


if __name__ == "__main__":
    main()
