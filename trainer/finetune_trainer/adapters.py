"""PEFT translator and adapter merging.

`peft_config(cfg)` gives a `LoraConfig` or None (full fine-tuning), in TRL's `get_peft_config` style; the
one `SFTTrainer` call wraps the model with it, so TRL applies its ZeRO-3 / QLoRA workarounds (research §4.2).
`merge_into_base` writes base+adapter as one model; under ZeRO-3 every rank must call it because the
sharded parameters are gathered collectively (`deepspeed.zero.GatheredParameters`, PEFT DeepSpeed guide).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune_trainer.config import TrainerConfig

if TYPE_CHECKING:
    from peft import LoraConfig

log = logging.getLogger(__name__)


def peft_config(cfg: TrainerConfig) -> LoraConfig | None:
    """LoRA on the configured modules; None when the spec asks for no adapter."""
    if cfg.lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def merge_into_base(model: Any, tokenizer: Any, out_dir: Path, *, zero3: bool, is_main: bool) -> None:
    """Merge the adapter into the base weights and save the result; collective under ZeRO-3."""
    import contextlib

    import torch

    gather: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if zero3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    state: dict[str, Any] = {}
    with gather, torch.no_grad():
        if is_main:
            model.merge_adapter()
            base = model.get_base_model()
            state = {
                k.replace(".base_layer.", "."): v.detach().to("cpu").clone()
                for k, v in base.state_dict().items()
                if "lora_" not in k
            }
            model.unmerge_adapter()
    if is_main:
        from huggingface_hub import save_torch_state_dict

        # Not `from_config` + `save_pretrained`: under ZeRO-3 that starts a collective zero.Init on one rank.
        out_dir.mkdir(parents=True, exist_ok=True)
        save_torch_state_dict(state, out_dir)
        model.get_base_model().config.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        log.info("merged model written to %s", out_dir)
