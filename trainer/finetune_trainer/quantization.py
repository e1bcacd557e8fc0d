"""QLoRA translator: `model.quantization` → bitsandbytes `BitsAndBytesConfig`, or None when off.

The quantized weights are packed into `storage_dtype` (`bnb_4bit_quant_storage`) and the model is loaded in
that same dtype, which is what lets ZeRO-3 shard a 4-bit model like any other (PEFT DeepSpeed guide). This
module only translates; the operator decides the load dtype (`strategy.dtype`), `model.py` applies it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from finetune_api.trainer_input import TrainerInput
from finetune_trainer.errors import InvalidConfigError

if TYPE_CHECKING:
    from transformers import BitsAndBytesConfig


def torch_dtype(name: str) -> Any:
    """'bfloat16' → torch.bfloat16 (names as in trainer.json)."""
    import torch

    return getattr(torch, name)


def quantization_config(cfg: TrainerInput, *, cuda: bool) -> BitsAndBytesConfig | None:
    """4-bit NF4/FP4 with optional double quantization; None when the spec has no quantization block."""
    q = cfg.model.quantization
    if q is None:
        return None
    if not cuda:
        raise InvalidConfigError(
            "model.quantization: QLoRA (bitsandbytes 4-bit) needs CUDA GPUs; remove model.quantization to train on CPU"
        )
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type=q.quant_type,
        bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=torch_dtype(q.compute_dtype),
        bnb_4bit_quant_storage=torch_dtype(q.storage_dtype),
    )


def load_dtype(cfg: TrainerInput) -> Any:
    """The dtype the model is loaded in, as the operator decided it (`strategy.dtype`; QLoRA: the storage dtype)."""
    return torch_dtype(cfg.strategy.dtype)
