"""trainer.json → TRL `SFTConfig`: the one place where our field names (the FineTuneJob API's) meet transformers' and
TRL's. A new `training` option is its field on the API model plus one line here.

It must be called before the model is loaded: creating the `SFTConfig` initialises the distributed state and,
under ZeRO-3, registers the DeepSpeed config that makes `from_pretrained` shard weights while loading
(`zero.Init`); a model loaded first is materialised whole on every rank. On a host without CUDA it sets
`use_cpu=True`, without which accelerate sees one process and DeepSpeed a world of N (research §2.4/§7).

Defaults that differ from TRL's `SFTConfig` (they are the API's, stated in `finetune_api.v1alpha1.spec`): one
epoch unless `maxSteps` (transformers: 3), `gradientCheckpointing` as the spec says (TRL: on), bf16 only when
`mixedPrecision` says so (TRL: on unless fp16), `learningRate` 1e-4 (TRL: 2e-5), `loggingSteps` 5 (TRL: 10),
`saveTotalLimit` 2 (transformers: unlimited).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from finetune_api.trainer_input import TrainerInput
from finetune_api.v1alpha1.spec import TrainingSpec
from finetune_trainer import output
from finetune_trainer.cpu import on_cpu

if TYPE_CHECKING:
    from trl.trainer.sft_config import SFTConfig

log = logging.getLogger(__name__)


def checkpointing_kwargs(t: TrainingSpec) -> dict[str, Any]:
    """What transformers' Trainer takes for activation checkpointing: `use_reentrant` goes on to
    torch.utils.checkpoint (TRL flips it to True under PEFT + ZeRO-3, in place), `offload` makes the model keep
    each checkpointed hidden state in pinned host memory (transformers >= 5.24)."""
    kwargs: dict[str, Any] = {"use_reentrant": t.use_reentrant}
    if t.offload_activations:
        kwargs["offload"] = True
    return kwargs


def checkpointing_on(cfg: TrainerInput) -> bool:
    """training.gradientCheckpointing as the operator resolved it; `auto` (a trainer.json not written by the
    operator's planner) is read as on, the choice that cannot run out of memory for want of it. Which layers are
    checkpointed is `strategy.checkpointedLayers` (applied to the model by `finetune_trainer.speed`)."""
    return cfg.training.gradient_checkpointing is not False


def build_sft_config(cfg: TrainerInput) -> SFTConfig:
    """Translate trainer.json into SFTConfig; precision and saving rules are decided here and logged once."""
    from trl.trainer.sft_config import SFTConfig

    t, d = cfg.training, cfg.dataset
    cpu = on_cpu(cfg)
    bf16 = t.mixed_precision == "bf16"
    fp16 = t.mixed_precision == "fp16"
    if cpu and fp16:
        log.warning("training.mixedPrecision: fp16 is not supported on CPU; training in fp32 instead")
        fp16 = False
    save_total_limit = t.save_total_limit
    if save_total_limit is not None and save_total_limit < 2:
        # The Trainer rotates old checkpoints before our completion marker lands on the new one; keeping two
        # means a kill in that window still leaves one complete checkpoint to resume from.
        log.warning(
            "training.saveTotalLimit %s raised to 2 so a complete checkpoint always survives",
            save_total_limit,
        )
        save_total_limit = 2
    eval_strategy = t.eval_strategy if len(d.splits) > 1 else "no"
    verbose = output.installed_settings().verbose
    from finetune_trainer import speed

    # fused AdamW where the Trainer (not DeepSpeed) steps the optimizer, on CUDA (speed.resolve_levers)
    levers = speed.resolve_levers(cfg, cuda=not cpu)
    optim = speed.optimizer_name(levers, cuda=not cpu, deepspeed=cfg.strategy.zero_stage > 0)
    extra: dict[str, Any] = {"optim": optim} if optim else {}
    return SFTConfig(
        **extra,
        output_dir=cfg.output.checkpoint_dir,
        use_cpu=cpu,
        bf16=bf16,
        fp16=fp16,
        seed=t.seed,
        data_seed=t.seed,
        # epochs: "1 unless maxSteps" (transformers' own default is 3; its max_steps wins when > 0, -1 is none)
        num_train_epochs=t.epochs if t.epochs is not None else 1.0,
        max_steps=t.max_steps if t.max_steps is not None else -1,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler_type,
        weight_decay=t.weight_decay,
        warmup_steps=t.warmup_ratio if t.warmup_ratio is not None else t.warmup_steps,  # below 1: a ratio
        max_grad_norm=t.max_grad_norm,
        neftune_noise_alpha=t.neftune_noise_alpha,
        per_device_train_batch_size=t.per_device_train_batch_size,
        per_device_eval_batch_size=t.per_device_eval_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        activation_checkpointing=checkpointing_on(cfg),
        activation_checkpointing_kwargs=checkpointing_kwargs(t) if checkpointing_on(cfg) else None,
        logging_strategy="steps",
        logging_steps=t.logging_steps,
        logging_first_step=True,
        eval_strategy=eval_strategy,
        eval_steps=t.eval_steps,
        save_strategy=t.save_strategy,
        save_steps=t.save_steps if t.save_steps is not None else 500,
        save_total_limit=save_total_limit,
        # Data: data.py tokenizes (so add_special_tokens / append_concat_token mean what the spec says), TRL
        # packs with best-fit-decreasing, which is padding-free: documents keep their own position_ids.
        max_length=d.max_seq_len,
        packing=d.packing,
        packing_strategy="bfd",
        pad_to_multiple_of=speed.pad_to_multiple_of(levers, packing=d.packing),
        eval_packing=d.packing,
        dataset_text_field=d.text_field,
        dataset_num_proc=None,
        include_num_input_tokens_seen="all",
        # Pushing is hub.py's job (retries, model card, exit codes), never the Trainer's.
        push_to_hub=False,
        report_to="none",
        ddp_find_unused_parameters=False,
        dataloader_num_workers=0,
        # Console output is finetune_trainer.output's: transformers at warning (info when verbose) on rank 0,
        # errors only elsewhere; no tqdm (it would write a bar into every log file). disable_tqdm makes the Trainer
        # add PrinterCallback (a dict print per log) instead, which progress.console_callbacks removes: the
        # progress callback's line says it once.
        log_level="info" if verbose else "warning",
        log_level_replica="info" if verbose else "error",
        disable_tqdm=True,
    )
