"""QLoRA under ZeRO-3: partition each 4-bit weight the moment it is quantized, not after the whole model is loaded.

transformers never builds a quantized model under `deepspeed.zero.Init` (bitsandbytes quantizes real tensors): every
rank quantizes the whole model onto its own GPU, after first reserving one block the size of the whole quantized
model to warm the allocator up, and DeepSpeed partitions it only inside `deepspeed.initialize`. For a 70B model that
is the whole 4-bit model (34 GiB) on every GPU while loading, more than the training step itself needs (bench run 8).

While `from_pretrained` runs under `partition_4bit_weights_while_loading()`:

* each `bitsandbytes.nn.Linear4bit` weight becomes a ZeRO-3 parameter as soon as transformers has quantized it and
  set it on its module. This is the conversion `deepspeed.initialize` would apply to it later
  (`deepspeed.zero.Init(module=...)`, the same config): rank 0's bytes are broadcast, this rank keeps its slice, the
  full tensor is freed. Its quantization state (absmax, code, nested statistics) stays on the parameter object, as
  it does when DeepSpeed partitions the model after loading;
* transformers' allocator warm-up (`caching_allocator_warmup`, one block of the whole quantized model's size) is
  skipped: the weights no longer stay on the GPU whole, and the block would be the load's peak by itself.

Everything else (embeddings, norms, lm_head, the LoRA layers PEFT adds later) is still partitioned by
`deepspeed.initialize`, which converts the parameters that are not ZeRO-3 parameters yet with the converter of one
that is, exactly as after a model built under `zero.Init`. Peak GPU memory while loading: this rank's share of the
4-bit weights, the (unsharded) quantization statistics and the unquantized modules, plus one layer's weight in the
load dtype at a time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


@contextlib.contextmanager
def partition_4bit_weights_while_loading() -> Iterator[dict[str, int]]:
    """Patch transformers' loader for the duration of one `from_pretrained` call; yields counters
    (`partitioned`: weights converted, `elements`: their elements in the storage dtype)."""
    import bitsandbytes as bnb
    import deepspeed
    import transformers.core_model_loading as loader
    import transformers.modeling_utils as modeling
    from deepspeed.runtime.zero.partition_parameters import is_zero_param
    from transformers.integrations.deepspeed import deepspeed_config

    stats = {"partitioned": 0, "elements": 0}
    first: list[Any] = []  # the first converted weight; its converter (and DeepSpeed config) converts the rest
    set_param = loader.set_param_for_module
    warmup = modeling.caching_allocator_warmup

    def set_and_partition(model: Any, target_name: str, *args: Any, **kwargs: Any) -> None:
        set_param(model, target_name, *args, **kwargs)
        module_path, _, name = target_name.rpartition(".")
        if name != "weight":
            return
        module = model.get_submodule(module_path) if module_path else model
        weight = getattr(module, "weight", None)
        if not (
            isinstance(module, bnb.nn.Linear4bit)
            and isinstance(weight, bnb.nn.Params4bit)
            and weight.bnb_quantized
            and not is_zero_param(weight)
        ):
            return
        # a bias (none in Llama) is set before its weight (keys load in sorted order): convert it along
        params = [p for p in module.parameters(recurse=False) if not is_zero_param(p) and p.device.type != "meta"]
        elements = weight.numel()
        if first:
            first[0].convert_to_zero_parameters(param_list=params)
        else:
            # DeepSpeed's own "partition an already-allocated module" (what deepspeed.initialize does to the model)
            deepspeed.zero.Init(module=module, config_dict_or_path=deepspeed_config())  # type: ignore[no-untyped-call]
            first.append(weight)
        stats["partitioned"] += 1
        stats["elements"] += elements

    loader.set_param_for_module = set_and_partition
    modeling.caching_allocator_warmup = _no_warmup
    try:
        yield stats
    finally:
        loader.set_param_for_module = set_param
        modeling.caching_allocator_warmup = warmup
    log.info(
        "QLoRA + ZeRO-3: partitioned %d 4-bit weights (%.2fB storage elements) while loading",
        stats["partitioned"],
        stats["elements"] / 1e9,
    )


def _no_warmup(*args: Any, **kwargs: Any) -> None:
    """Stands in for transformers' caching_allocator_warmup while loading (see the module docstring)."""
