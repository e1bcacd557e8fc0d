"""PEFT translator and adapter merging.

`peft_config(cfg)` translates the spec's `adapter` into PEFT's `LoraConfig`, in TRL's `get_peft_config` style (LoRA
is the only adapter the API offers, so it is never off); the one `SFTTrainer` call wraps the model with it, so TRL
applies its ZeRO-3 / QLoRA workarounds (research §4.2).
`merge_into_base` writes base+adapter as one model; under ZeRO-3 every rank must call it because the
sharded parameters are gathered collectively (`deepspeed.zero.GatheredParameters`, PEFT DeepSpeed guide),
one module at a time so that the merge of a model larger than one GPU does not run out of memory.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune_api.trainer_input import TrainerInput

if TYPE_CHECKING:
    from peft import LoraConfig

log = logging.getLogger(__name__)


def peft_config(cfg: TrainerInput) -> LoraConfig:
    """LoRA on the configured modules: our `adapter` names meet PEFT's here and nowhere else."""
    from peft import LoraConfig

    a = cfg.adapter
    return LoraConfig(
        r=a.r,
        lora_alpha=a.alpha,
        lora_dropout=a.dropout,
        target_modules=a.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def _gathered(params: list[Any], zero3: bool) -> contextlib.AbstractContextManager[Any]:
    """Under ZeRO-3, these parameters whole on every rank for the block (collective); else nothing to do."""
    if not zero3 or not params:
        return contextlib.nullcontext()
    import deepspeed

    gathered: contextlib.AbstractContextManager[Any] = deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    return gathered


def merged_state_dict(model: Any, *, zero3: bool, is_main: bool) -> dict[str, Any]:
    """The base model's weights with the adapter merged in, on the CPU of the main rank (empty elsewhere).

    Gathered one module at a time, so under ZeRO-3 no GPU ever holds more than one layer's linear plus its
    adapter: gathering the whole model at once needs it to fit one GPU (a 70B model does not). Every rank
    must call this: each gather is collective.
    """
    import torch
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    state: dict[str, Any] = {}
    inside_lora: set[int] = set()
    for name, module in base.named_modules():
        if id(module) in inside_lora:
            continue
        prefix = f"{name}." if name else ""
        if isinstance(module, LoraLayer):
            layer: Any = module  # a torch Module too (peft's LoRA Linear)
            inside_lora.update(id(m) for m in layer.modules())
            with _gathered(list(layer.parameters()), zero3), torch.no_grad():
                if is_main:  # what PEFT's merge adds to the weight, without touching the live model
                    weights = {k: v.detach().clone() for k, v in layer.base_layer.state_dict().items()}
                    for adapter in layer.active_adapters:
                        weights["weight"] += layer.get_delta_weight(adapter)
                    state.update({prefix + k: v.to("cpu") for k, v in weights.items()})
            continue
        direct = list(module.named_parameters(recurse=False))
        with _gathered([p for _, p in direct], zero3), torch.no_grad():
            if is_main:
                for key, value in direct:
                    state[prefix + key] = value.detach().to("cpu").clone()
    if is_main:  # persistent buffers: never partitioned by ZeRO
        for key, value in base.state_dict().items():
            if key not in state and "lora_" not in key and ".base_layer." not in key:
                state[key] = value.detach().to("cpu").clone()
    return state


def merge_into_base(model: Any, tokenizer: Any, out_dir: Path, *, zero3: bool, is_main: bool) -> None:
    """Merge the adapter into the base weights and save the result; collective under ZeRO-3."""
    state = merged_state_dict(model, zero3=zero3, is_main=is_main)
    if is_main:
        from huggingface_hub import save_torch_state_dict

        # Not `from_config` + `save_pretrained`: under ZeRO-3 that starts a collective zero.Init on one rank.
        out_dir.mkdir(parents=True, exist_ok=True)
        save_torch_state_dict(state, out_dir)
        model.get_base_model().config.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        log.info("merged model written to %s", out_dir)
