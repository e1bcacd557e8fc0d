"""Load the tokenizer and the base causal LM: Hub id or local path, optional QLoRA, attention fallback.

Must run after `build_sft_config` (ZeRO-3 `zero.Init` while loading). An id or path that does not exist is a
permanent error (exit 66); a network or Hub outage is not, and escapes as an ordinary, retryable exception.
No `device_map` under DeepSpeed or DDP: the Trainer places the model (research §3.3).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from finetune_api import constants
from finetune_api.trainer_input import TrainerInput
from finetune_trainer.errors import UnknownModelError
from finetune_trainer.quantization import load_dtype, quantization_config
from finetune_trainer.templates import install_chat_template

log = logging.getLogger(__name__)


def _hub_kwargs(cfg: TrainerInput, path: str) -> dict[str, Any]:
    """revision and token only for Hub ids; local directories take neither."""
    if Path(path).is_dir():
        return {"trust_remote_code": cfg.model.trust_remote_code}
    return {
        "revision": cfg.model.revision,
        "token": os.environ.get("HF_TOKEN") or None,
        "trust_remote_code": cfg.model.trust_remote_code,
    }


def check_model_exists(cfg: TrainerInput, path: str) -> Any:
    """Read the model's config, turning "no such model" (and only that) into UnknownModelError."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from transformers import AutoConfig

    permanent = (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError, HFValidationError)
    looks_local = path.startswith(("/", "./", "../", "~"))
    if looks_local and not Path(path).expanduser().is_dir():
        raise UnknownModelError(f"model.name: local path {path!r} does not exist or is not a directory")
    try:
        return AutoConfig.from_pretrained(path, **_hub_kwargs(cfg, path))
    except (OSError, ValueError) as e:
        cause = e if isinstance(e, permanent) else e.__cause__
        if isinstance(cause, permanent) or (Path(path).is_dir() and isinstance(e, OSError | ValueError)):
            raise UnknownModelError(
                f"model.name: {path!r} (revision {cfg.model.revision!r}) is not a loadable model: "
                f"{str(e).splitlines()[0]}"
            ) from e
        raise


FLASH_ATTN_FIX = (
    "use a trainer image built from the Dockerfile's trainer-flash-attn target (make images FTJOB_FLASH_ATTN=1)"
)


def flash_attn_problem(*, cuda: bool) -> str | None:
    """Why flash_attention_2 cannot run here (no CUDA device, flash_attn missing or not importable), or None.

    Asked before the model loads: transformers would otherwise fail inside from_pretrained, as an ordinary
    (retryable) error. The default trainer image has no flash_attn (it is compiled only in trainer-flash-attn).
    """
    if not cuda:
        return "no CUDA device"
    if importlib.util.find_spec("flash_attn") is None:
        return f"the flash_attn package is not installed in this image; {FLASH_ATTN_FIX}"
    try:
        importlib.import_module("flash_attn")
    except (ImportError, OSError) as e:  # an extension built for another torch/CUDA: undefined symbols
        first_line = (str(e).splitlines() or [type(e).__name__])[0]
        return f"flash_attn does not import ({first_line}); {FLASH_ATTN_FIX}"
    return None


def attn_implementation(cfg: TrainerInput, *, cuda: bool) -> str:
    """The requested attention, or sdpa with one clear line when flash-attn cannot run here (the documented
    fallback of model.attnImplementation; packed batches on CUDA still get torch's varlen flash kernel, speed.py)."""
    want = cfg.model.attn_implementation
    if want == "flash_attention_2":
        problem = flash_attn_problem(cuda=cuda)
        if problem is not None:
            log.warning("model.attnImplementation flash_attention_2 unavailable (%s); using sdpa", problem)
            return "sdpa"
    return want


def load_tokenizer(cfg: TrainerInput, path: str) -> Any:
    """Tokenizer with the spec's chat template installed and a pad token set."""
    from transformers import AutoTokenizer

    check_model_exists(cfg, path)  # first thing touching the model: an unknown id fails here, as exit 66
    tokenizer = AutoTokenizer.from_pretrained(path, **_hub_kwargs(cfg, path))
    added = install_chat_template(tokenizer, cfg.dataset.chat_template_format)
    if added:
        log.info(
            "added %d chat-template tokens (%s); embeddings will be resized",
            added,
            cfg.dataset.chat_template_format,
        )
    return tokenizer


def load_model(cfg: TrainerInput, path: str, tokenizer: Any, *, cuda: bool, zero3: bool) -> Any:
    """AutoModelForCausalLM in the configured dtype (QLoRA: storage dtype), caches off for training."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {
        "dtype": load_dtype(cfg),
        "attn_implementation": attn_implementation(cfg, cuda=cuda),
        **_hub_kwargs(cfg, path),
    }
    bnb = quantization_config(cfg, cuda=cuda)
    if bnb is not None:
        kwargs["quantization_config"] = bnb
        if not zero3:  # DDP QLoRA: each process quantizes onto its own GPU
            from accelerate import PartialState

            kwargs["device_map"] = {"": PartialState().local_process_index}
    loading: Any = contextlib.nullcontext()
    # QLoRA + ZeRO-3: partition each 4-bit weight as it is quantized (zero3_loading.py);
    # FTJOB_ZERO3_4BIT_LOAD=whole: transformers' own load (the whole 4-bit model on each GPU until DeepSpeed starts)
    if bnb is not None and zero3 and os.environ.get(constants.ENV_ZERO3_4BIT_LOAD, "partitioned") != "whole":
        from finetune_trainer.zero3_loading import partition_4bit_weights_while_loading

        loading = partition_4bit_weights_while_loading()
    with loading:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.config.use_cache = False  # a KV cache during training also disables packed-sequence masking
    if len(tokenizer) > model.config.vocab_size:  # not the weight's shape: under ZeRO-3 it is partitioned
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8)
    # Performance levers (varlen packed attention, torch.compile or Liger kernels), automatic on CUDA only
    from finetune_trainer import speed

    speed.apply_to_model(
        model,
        speed.resolve_levers(cfg, cuda=cuda),
        cuda=cuda,
        packing=cfg.dataset.packing,
        quantized=cfg.model.quantization is not None,
    )
    # gradientCheckpointing: auto may checkpoint only some decoder layers (the planner's count)
    count = cfg.strategy.checkpointed_layers
    if count is not None and cfg.training.gradient_checkpointing is not False:
        speed.checkpoint_only(model, count)
    return model
