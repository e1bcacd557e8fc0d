"""Our trainer (`python -m finetune_trainer --config trainer.json`), instrumented like the seed benchmark.

Run in place of `-m finetune_trainer` in the rendered node command. It changes nothing the trainer does; it
 * subclasses TRL's SFTTrainer (which `finetune_trainer.__main__` imports at call time) to add the seed
   benchmark's step timer (torch.cuda.synchronize + wall time at every step begin/end) and token counter, and
 * records peak GPU memory: `torch.cuda.max_memory_allocated` before training (model load, DeepSpeed init) and
   during training (reset at on_train_begin), max reserved, and the device's used memory at the end.
 * records, besides, the allocator's peak reserved memory and the device's used memory when training begins
   (after loading and deepspeed.initialize), and whether the allocator's segments are expandable.
 * FTJOB_SPEED=varlen,liger,... applies speed levers through finetune_trainer.speed when the trainer itself does
   not (for measuring levers one at a time); FTJOB_BENCH_NOTE is copied into the result.
 * FTJOB_BENCH_FP8_CAST=1: checkpoints stored in fp8 (make_models.py --fp8-storage, for the 70B shape) are cast to
   the load dtype on the GPU instead of by PyTorch's scalar CPU cast (17x slower loads than the 8B bf16 checkpoint:
   bench run 6). FTJOB_BENCH_FP8_EDGES=N: `training.precision: fp8` keeps N decoder layers at each end bf16
   (sets `finetune_trainer.fp8.BF16_EDGE_LAYERS`). FTJOB_BENCH_RANDOM_INIT=1: a non-quantized model is built from
   its config under zero.Init with random weights instead of loaded (as the seed recipe's 70B job is "built under
   ZeRO-3 init"). Neither changes what is trained.
Rank 0 appends one JSON line to $FTJOB_BENCH_RESULTS in the seed script's result schema (plus our fields).
"""

import time

T_START = time.time()

import gc  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def bench_model_shims() -> None:
    """Bench-only loading shortcuts for random-weight models (see the module docstring)."""
    import torch

    if os.environ.get("FTJOB_BENCH_FP8_CAST") == "1" and torch.cuda.is_available():
        import transformers.core_model_loading as cml

        materialize = cml._materialize_copy
        gpu = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))

        def cast_on_gpu(tensor, device=None, dtype=None):  # noqa: ANN001, ANN202
            tensor = tensor[...]  # a lazy safetensors slice until indexed (what transformers' own copy does first)
            if tensor.dtype == torch.float8_e4m3fn and dtype is not None and dtype != tensor.dtype:
                out = tensor.to(gpu).to(dtype)  # 1 byte per parameter over PCIe, the cast on the GPU
                return out if device is not None and torch.device(device).type == "cuda" else out.to(device or "cpu")
            return materialize(tensor, device, dtype)

        cml._materialize_copy = cast_on_gpu
    if os.environ.get("FTJOB_BENCH_FP8_EDGES"):  # fp8 quality variants: decoder layers at each end kept bf16
        import finetune_trainer.fp8 as fp8

        fp8.BF16_EDGE_LAYERS = int(os.environ["FTJOB_BENCH_FP8_EDGES"])
    if os.environ.get("FTJOB_BENCH_RANDOM_INIT") == "1":
        from transformers import AutoConfig, AutoModelForCausalLM

        load = AutoModelForCausalLM.from_pretrained

        def build_random(path, **kw):  # noqa: ANN001, ANN003, ANN202
            if "quantization_config" in kw:
                return load(path, **kw)
            print(f"bench: building {path} from its config with random weights (zero.Init under ZeRO-3)", flush=True)
            return AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(path), dtype=kw.get("dtype"), attn_implementation=kw.get("attn_implementation"))

        AutoModelForCausalLM.from_pretrained = staticmethod(build_random)


def main() -> int:
    bench_model_shims()
    import torch
    import torch.distributed as dist
    import trl
    from transformers import TrainerCallback

    import finetune_trainer.__main__ as entry
    import finetune_trainer.arguments as fa
    import finetune_trainer.model as fm
    from finetune_trainer import speed

    t_imports = time.time()
    name = os.environ.get("FTJOB_BENCH_NAME", "ours")
    results = os.environ.get("FTJOB_BENCH_RESULTS", "results.jsonl")
    measure = int(os.environ.get("FTJOB_BENCH_MEASURE", "8"))
    levers = speed.parse_levers(os.environ.get("FTJOB_SPEED"))
    if os.environ.get("FTJOB_BENCH_COMPILE_DYNAMIC") == "1":  # compile's dynamic=True (recompile measurements)
        speed.COMPILE_DYNAMIC = True
    if os.environ.get("FTJOB_BENCH_COMPILE_MODE"):  # torch.compile's mode, e.g. reduce-overhead (CUDA graphs)
        speed.COMPILE_MODE = os.environ["FTJOB_BENCH_COMPILE_MODE"]
    cuda = torch.cuda.is_available()
    info: dict = {"levers_requested": sorted(levers), "levers_applied": []}
    # Once the trainer applies speed.resolve_levers itself (which reads FTJOB_SPEED), only record what it did.
    integrated = "resolve_levers" in inspect.getsource(fm.load_model)

    if levers and not integrated:
        original_load = fm.load_model

        def load_model(cfg, path, tokenizer, *, cuda, zero3):
            model = original_load(cfg, path, tokenizer, cuda=cuda, zero3=zero3)
            info["levers_applied"] = speed.apply_to_model(
                model, levers, cuda=cuda, packing=cfg.data.packing, quantized=cfg.model.quantization is not None
            )
            return model

        fm.load_model = load_model
        original_args = fa.build_sft_config

        def build_sft_config(cfg):
            args = original_args(cfg)
            use_ds = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
            optim = speed.optimizer_name(levers, cuda=cuda, deepspeed=use_ds)
            if optim:
                from transformers.training_args import OptimizerNames

                args.optim = OptimizerNames(optim)
                info["levers_applied"] = sorted({*info["levers_applied"], "fused_adamw"})
            return args

        fa.build_sft_config = build_sft_config

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    profile_steps = [int(x) for x in os.environ.get("FTJOB_BENCH_PROFILE", "").split(",") if x.strip()]

    class StepTimer(TrainerCallback):
        """Step begin/end after a device sync, plus per step: Python GC pause, torch.compile graphs so far,
        allocator retries and device allocations (what can make one step slow), and an optional profile."""

        def __init__(self) -> None:
            self.begin: list[float] = []
            self.end: list[float] = []
            self.train_begin = None
            self.peak_before_train = 0.0
            self.written = False
            self.gc_s: list[float] = []  # per step: seconds in Python's garbage collector
            self.gc_full: list[int] = []  # per step: collections of the oldest generation
            self.graphs: list[int] = []  # per step end: torch.compile graphs compiled so far
            self.alloc_retries: list[int] = []
            self.device_allocs: list[int] = []
            self._gc_now = [0.0, 0, None]
            self.profiler = None
            self.profile_t0 = 0.0
            gc.callbacks.append(self._on_gc)

        def _on_gc(self, phase, gc_info):
            if phase == "start":
                self._gc_now[2] = time.perf_counter()
            elif self._gc_now[2] is not None:
                self._gc_now[0] += time.perf_counter() - self._gc_now[2]
                self._gc_now[1] += int(gc_info.get("generation") == 2)
                self._gc_now[2] = None

        def on_train_begin(self, args, state, control, **kw):
            sync()
            self.train_begin = time.time()
            if cuda:
                self.peak_before_train = torch.cuda.max_memory_allocated() / 2**30
                info["mem_at_train_begin_gib"] = torch.cuda.memory_allocated() / 2**30
                # loading + deepspeed.initialize: the allocator's peak, and what else the device holds right now
                info["max_mem_reserved_before_train_gib"] = torch.cuda.max_memory_reserved() / 2**30
                free, total = torch.cuda.mem_get_info()
                info["device_used_at_train_begin_gib"] = (total - free) / 2**30
                info["reserved_at_train_begin_gib"] = torch.cuda.memory_reserved() / 2**30
                torch.cuda.reset_peak_memory_stats()

        def on_step_begin(self, args, state, control, **kw):
            sync()
            if profile_steps and state.global_step + 1 == profile_steps[0] and cuda:
                from torch.profiler import ProfilerActivity, profile

                self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                self.profiler.__enter__()
                self.profile_t0 = time.time()
            self._gc_now[:2] = [0.0, 0]
            self.begin.append(time.time())

        def on_step_end(self, args, state, control, **kw):
            sync()
            self.end.append(time.time())
            self.gc_s.append(self._gc_now[0])
            self.gc_full.append(self._gc_now[1])
            self.graphs.append(int(dynamo_counters().get("stats", {}).get("unique_graphs", 0)))
            if cuda:
                stats = torch.cuda.memory_stats()
                self.alloc_retries.append(int(stats.get("num_alloc_retries", 0)))
                self.device_allocs.append(int(stats.get("num_device_alloc", 0)))
            if self.profiler is not None and state.global_step == profile_steps[-1]:
                wall = time.time() - self.profile_t0
                self.profiler.__exit__(None, None, None)
                import step_profile

                summary = step_profile.summarize(
                    step_profile.kernel_times(self.profiler),
                    steps=profile_steps[-1] - profile_steps[0] + 1,
                    wall_s=wall,
                )
                info["profile"] = summary
                try:
                    table = self.profiler.key_averages().table(sort_by="self_device_time_total", row_limit=60)
                except Exception:  # older torch names the column after CUDA
                    table = self.profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=60)
                out = Path(results).parent / f"profile_{name}.txt"
                out.write_text(step_profile.render(summary) + "\n\n" + table + "\n")
                self.profiler = None

        def on_train_end(self, args, state, control, model=None, **kw):
            if not self.written:
                self.written = True
                write_result(self, state, model)

    timer = StepTimer()
    tokens: list[int] = []
    shapes: list[dict] = []

    class TimedSFTTrainer(trl.SFTTrainer):
        def __init__(self, *a, callbacks=None, **kw):
            super().__init__(*a, callbacks=[*(callbacks or []), timer], **kw)
            info["trainer"] = self

        def training_step(self, model, inputs, *a, **kw):
            ids = inputs.get("input_ids")
            if ids is not None:
                tokens.append(int(ids.numel()))
                if len(shapes) < 2:
                    pos = inputs.get("position_ids")
                    shapes.append(
                        {k: list(v.shape) for k, v in inputs.items() if hasattr(v, "shape")}
                        | {"n_docs": int((pos == 0).sum()) if pos is not None else None}
                    )
            return super().training_step(model, inputs, *a, **kw)

    import trl.trainer.sft_trainer as sft_module

    trl.SFTTrainer = TimedSFTTrainer  # both names the trainer may import it by
    sft_module.SFTTrainer = TimedSFTTrainer

    def expandable() -> bool | None:
        """Whether the allocator's segments are expandable (what PYTORCH_CUDA_ALLOC_CONF / the trainer chose)."""
        if not cuda:
            return None
        try:
            segments = torch.cuda.memory._snapshot()["segments"]
        except Exception:  # a bench record, never a failure
            return None
        return any(seg.get("is_expandable") for seg in segments) if segments else None

    def dynamo_counters() -> dict:
        """torch.compile's counters (graphs compiled, recompiles, graph breaks) at the end of training."""
        try:
            from torch._dynamo.utils import counters

            return {k: counters[k] for k in ("stats", "recompiles", "graph_break") if k in counters}
        except Exception:  # a bench record, never a failure
            return {}

    def decoder_layers(model) -> list:
        from transformers.modeling_layers import GradientCheckpointingLayer

        return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)] if model is not None else []

    def zero_stage(trainer) -> int:
        """The ZeRO stage DeepSpeed runs: accelerate exports ACCELERATE_DEEPSPEED_ZERO_STAGE only for a stage written in
        its own config, not for one in a deepspeed.json (`deepspeed_config_file`, which the operator renders), so
        read the config the Trainer handed to DeepSpeed (runs 1-12 labelled such ZeRO-3 jobs deepspeed-zero0)."""
        hf_config = getattr(getattr(trainer, "args", None), "hf_deepspeed_config", None)
        stage = (getattr(hf_config, "config", None) or {}).get("zero_optimization", {}).get("stage")
        if stage is None:
            plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "deepspeed_plugin", None)
            stage = getattr(plugin, "zero_stage", None)
        return int(stage if stage is not None else os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "0"))

    def write_result(timer: StepTimer, state, model) -> None:
        sync()
        rank = int(os.environ.get("RANK", "0"))
        trainer = info.get("trainer")
        ga = trainer.args.gradient_accumulation_steps if trainer is not None else 1
        per_step = [sum(tokens[i : i + ga]) for i in range(0, len(tokens) - ga + 1, ga)]
        used = None
        if cuda:
            free, total = torch.cuda.mem_get_info()
            used = (total - free) / 2**30
        res = dict(
            rank=rank,
            step_begin=[t - T_START for t in timer.begin],
            step_end=[t - T_START for t in timer.end],
            tokens_per_step=per_step,
            batch_shapes=shapes,
            max_mem_alloc_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
            max_mem_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0,
            max_mem_alloc_before_train_gib=timer.peak_before_train,
            device_used_at_end_gib=used,
            reserved_at_end_gib=torch.cuda.memory_reserved() / 2**30 if cuda else 0.0,
            t_imports=t_imports - T_START,
            t_start_to_train_begin=(timer.train_begin - T_START) if timer.train_begin else None,
            t_first_step=(timer.end[0] - timer.begin[0]) if timer.end else None,
            t_start_to_first_step_end=(timer.end[0] - T_START) if timer.end else None,
            mem_at_train_begin_gib=info.get("mem_at_train_begin_gib"),
            max_mem_reserved_before_train_gib=info.get("max_mem_reserved_before_train_gib"),
            device_used_at_train_begin_gib=info.get("device_used_at_train_begin_gib"),
            reserved_at_train_begin_gib=info.get("reserved_at_train_begin_gib"),
            expandable_segments=expandable(),
            dynamo_counters={k: dict(v) for k, v in dynamo_counters().items()},
            checkpointed_layers=sum(bool(getattr(m, "gradient_checkpointing", False)) for m in decoder_layers(model)),
            alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            step_gc_s=timer.gc_s,
            step_gc_full=timer.gc_full,
            step_graphs=timer.graphs,
            step_alloc_retries=timer.alloc_retries,
            step_device_allocs=timer.device_allocs,
            gc_frozen=gc.get_freeze_count(),
        )
        gathered = [res]
        if dist.is_available() and dist.is_initialized():
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, res)
        if rank != 0:
            return

        def steady(r: dict) -> list[float]:
            ends = r["step_end"]
            iv = [ends[i] - ends[i - 1] for i in range(1, len(ends))]
            return iv[-measure:] if len(iv) >= measure else iv

        if integrated or not levers:  # the trainer chose its levers itself
            info["levers_applied"] = speed.applied_levers()
        ok = all(len(steady(r)) > 0 for r in gathered)
        step_s = max(statistics.mean(steady(r)) for r in gathered) if ok else None
        tok_step = (
            statistics.mean(statistics.mean(r["tokens_per_step"][-measure:]) for r in gathered if r["tokens_per_step"])
            if ok
            else None
        )
        cfg = (model.config if model is not None else None) or trainer.model.config
        base = getattr(model, "get_base_model", lambda: model)()
        n_trainable = sum(int(getattr(p, "ds_numel", 0) or p.numel()) for p in model.parameters() if p.requires_grad)
        n_base = sum(int(getattr(p, "ds_numel", 0) or p.numel()) for p in base.parameters())
        use_ds = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
        stage = zero_stage(trainer) if use_ds else 0
        world = int(os.environ.get("WORLD_SIZE", "1"))
        losses = [h.get("loss") for h in state.log_history if "loss" in h]
        args = trainer.args
        summary = dict(
            name=name,
            ok=ok,
            impl="ours",
            note=os.environ.get("FTJOB_BENCH_NOTE", ""),
            backend=f"deepspeed-zero{stage}" if use_ds else ("ddp" if world > 1 else "single"),
            zero_stage=stage,
            liger="liger" in info["levers_applied"],
            levers_requested=info["levers_requested"],
            levers_applied=info["levers_applied"],
            attn_implementation=getattr(cfg, "_attn_implementation", None),
            packing_strategy=args.packing_strategy if args.packing else None,
            padding_free=bool(getattr(trainer, "padding_free", False)),
            world=world,
            bsz=args.per_device_train_batch_size,
            grad_accum=ga,
            seq=args.max_length,
            doc_len=args.max_length,
            steps=state.global_step,
            measure=measure,
            layers=cfg.num_hidden_layers,
            hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size,
            heads=cfg.num_attention_heads,
            kv_heads=cfg.num_key_value_heads,
            vocab=cfg.vocab_size,
            n_base_params=n_base,
            n_trainable=n_trainable,
            step_s=step_s,
            step_s_min=min(min(steady(r)) for r in gathered) if ok else None,
            step_s_max=max(max(steady(r)) for r in gathered) if ok else None,
            tokens_per_step_per_gpu=tok_step,
            tokens_per_s_per_gpu=(tok_step / step_s) if ok else None,
            losses=losses,
            eval_losses=[[h.get("step"), h["eval_loss"]] for h in state.log_history if "eval_loss" in h],
            gradient_checkpointing=bool(args.gradient_checkpointing),
            gc_kwargs_effective=dict(args.gradient_checkpointing_kwargs or {}),
            optim=str(args.optim),
            lora_param_dtype=str(next((p.dtype for p in model.parameters() if p.requires_grad), None)),
            quantized=bool(getattr(cfg, "quantization_config", None)),
            loss_finite=all(x is not None and x == x and abs(x) != float("inf") for x in losses),
            ranks=gathered,
            profile=info.get("profile"),
            pad_to_multiple_of=getattr(args, "pad_to_multiple_of", None),
        )
        line = json.dumps(summary, default=str)
        print("RESULT_JSON " + line, flush=True)
        with open(results, "a") as f:
            f.write(line + "\n")

    return entry.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
