"""Fine-tune a causal LM with TRL + PEFT from one trainer.json: config → one SFTTrainer call → adapter.

Usage (what each pod runs; `python -m finetune_trainer --config trainer.json` alone also works):

    accelerate launch --config_file /etc/ftjob/accelerate.yaml ... \
        -m finetune_trainer --config /etc/ftjob/trainer.json

Exit codes: 0 done; 64 invalid trainer.json, 65 bad dataset, 66 unknown model (permanent, the operator fails
the job at once); 143 stopped by SIGTERM after a complete checkpoint; anything else is retryable. A worker that
fails knowingly also writes its termination record for the launcher around it (`errors.report`), because
`accelerate launch` turns every worker failure into exit 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from finetune_api.termination import TerminationRecord
from finetune_trainer import output as console  # train() has a local `output` (the checkpoint directory)
from finetune_trainer.compat import zero3_checkpointing_problem
from finetune_trainer.errors import (
    EXIT_SIGTERM,
    InvalidConfigError,
    PermanentError,
    PushFailedError,
    inject_test_fault,
    report,
)

log = logging.getLogger("finetune_trainer")


def train(config_path: str) -> int:
    """Load, build, train (resuming), save, push; every rank runs this, I/O to the Hub on the main process."""
    from finetune_trainer import builtin
    from finetune_trainer.adapters import merge_into_base, peft_config
    from finetune_trainer.allocator import use_expandable_segments
    from finetune_trainer.arguments import build_sft_config
    from finetune_trainer.cards import write_card
    from finetune_trainer.checkpoints import CompletionMarker, SaveOnSigterm, prepare_resume
    from finetune_trainer.cpu import on_cpu, prepare_cpu_backend
    from finetune_trainer.data import load_data
    from finetune_trainer.heap import FreezeSetupHeap
    from finetune_trainer.hub import PushOnSave, hub_target, push
    from finetune_trainer.loading import load_config
    from finetune_trainer.model import load_model, load_tokenizer
    from finetune_trainer.probes import write_probe
    from finetune_trainer.progress import ProgressCallback, Reporter, console_callbacks, report_output

    cfg = load_config(config_path)
    if cfg.training.precision == "fp8":
        from finetune_trainer.fp8 import fp8_config_problem

        fp8_problem = fp8_config_problem(zero_stage=cfg.strategy.zero_stage)  # before the model: no time wasted
        if fp8_problem is not None:
            raise InvalidConfigError(fp8_problem)
    model_path = builtin.resolve_model(cfg.model.name)  # generated files, before any zero.Init
    data_path = builtin.resolve_dataset(cfg.dataset.name)
    prepare_cpu_backend(cfg)
    use_expandable_segments()  # before anything allocates on a GPU
    args = build_sft_config(cfg)  # before the model: ZeRO-3 shards while loading

    import transformers
    from accelerate import PartialState
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    from trl.trainer.sft_trainer import SFTTrainer

    state = PartialState()
    zero3 = bool(is_deepspeed_zero3_enabled())  # type: ignore[no-untyped-call]
    problem = zero3_checkpointing_problem(
        transformers.__version__, zero3=zero3, checkpointing=cfg.training.gradient_checkpointing is not False
    )
    if problem is not None:
        raise InvalidConfigError(problem)
    log.info(
        "job %s/%s: %d processes on %d machines, %s, %s",
        cfg.job.namespace,
        cfg.job.name,
        state.num_processes,
        cfg.strategy.num_machines,
        "CPU" if on_cpu(cfg) else "CUDA",
        f"ZeRO-{cfg.strategy.zero_stage}" if cfg.strategy.zero_stage else "plain data parallel (no ZeRO)",
    )

    tokenizer = load_tokenizer(cfg, model_path)
    train_ds, eval_ds = load_data(cfg, data_path, tokenizer)
    model = load_model(cfg, model_path, tokenizer, cuda=not on_cpu(cfg), zero3=zero3)
    log.info("model loaded from %s", model_path)
    inject_test_fault()

    output = Path(cfg.output.checkpoint_dir)  # = args.output_dir
    resume = prepare_resume(output, is_main=state.is_main_process)
    log.info("resuming from %s" if resume else "fresh start (no complete checkpoint in %s)", resume or output)
    reporter = Reporter()
    sigterm = SaveOnSigterm()
    callbacks = [CompletionMarker(), sigterm, ProgressCallback(reporter, output / "metrics.jsonl"), FreezeSetupHeap()]
    target = hub_target(cfg)
    if target is not None:
        callbacks.append(PushOnSave(*target))

    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        peft_config=peft_config(cfg),
        callbacks=callbacks,
    )
    if cfg.training.precision == "fp8":
        from finetune_trainer.fp8 import apply_fp8

        # PEFT has wrapped the model by now, and nothing has traced it yet (torch.compile does at the first step)
        apply_fp8(trainer.model, device=args.device)  # type: ignore[arg-type]  # set by SFTTrainer: never None
    console_callbacks(trainer)
    console.adopt_loggers()  # DeepSpeed's, imported by now
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    if sigterm.stopped:
        log.warning(
            "stopped by SIGTERM at step %d; checkpoint saved, exiting for a restart",
            trainer.state.global_step,
        )
        return EXIT_SIGTERM

    adapter_dir = Path(cfg.output.adapter_dir)
    trainer.save_model(str(adapter_dir))  # collective under ZeRO-3
    trainer.save_state()
    metrics = {**result.metrics}
    if eval_ds is not None:
        metrics.update(trainer.evaluate())
    if cfg.output.probe_path:
        write_probe(
            trainer.model,
            tokenizer,
            Path(cfg.output.probe_path),
            device=args.device,
            is_main=state.is_main_process,
        )
    if cfg.training.merge_adapter:
        merge_into_base(
            trainer.model,
            tokenizer,
            adapter_dir.parent / "merged",
            zero3=zero3,
            is_main=state.is_main_process,
        )
    state.wait_for_everyone()

    if state.is_main_process:
        write_card(cfg, adapter_dir, metrics, trainer.state.log_history)
        mean_loss = float(metrics.get("train_loss", float("nan")))
        log.info("adapter written to %s (mean training loss %.4g)", adapter_dir, mean_loss)
        if target is not None:
            status = push(
                *target,
                adapter_dir,
                message=f"{cfg.job.name}: adapter after step {trainer.state.global_step}",
            )
            report_output(reporter, status)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m finetune_trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="path to trainer.json")
    ns = parser.parse_args(argv)
    console.setup()
    try:
        return train(ns.config)
    except PermanentError as e:
        log.error("permanent error (exit %d): %s", e.exit_code, e.message)
        report(TerminationRecord(exit_code=e.exit_code, reason=type(e).__name__, message=e.message))
        return e.exit_code
    except PushFailedError as e:
        log.error("%s", e)
        report(TerminationRecord(exit_code=1, reason=type(e).__name__, message=str(e)))
        return 1
    finally:
        _leave_process_group()
        console.finish()


def _leave_process_group() -> None:
    """Tear down torch.distributed explicitly; relying on interpreter exit can hang a gloo group."""
    if "torch" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
