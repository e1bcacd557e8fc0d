"""spec -> deepspeed.json, rendered only when the accelerate plugin keys cannot say it all.

That is when `distributed.deepspeed.overrides` is set: the JSON then carries the whole DeepSpeed
config, with "auto" wherever the HF Trainer fills values from its own arguments (batch sizes,
accumulation, clipping, precision, bucket sizes), so the two can never disagree, and the overrides
merged last. Without overrides, returns None and accelerate builds the same config from its keys.
"""

from typing import Any

from finetune_operator.api.resource import FineTuneJob
from finetune_operator.plan import Plan


def _offload(device: str, nvme_path: str | None) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device}
    if device == "nvme" and nvme_path:
        block["nvme_path"] = nvme_path
    if device != "none":
        block["pin_memory"] = True
    return block


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` wins; nested dicts merge key by key."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_deepspeed(job: FineTuneJob, plan: Plan) -> dict[str, Any] | None:
    """The DeepSpeed JSON, or None when it is not needed (no overrides, or ZeRO off)."""
    ds = job.spec.distributed.deepspeed
    strategy = plan.strategy
    if strategy.zero_stage == 0 or not ds.overrides:
        return None
    zero: dict[str, Any] = {
        "stage": strategy.zero_stage,
        "offload_optimizer": _offload(strategy.offload_optimizer, ds.nvme_path),
        "offload_param": _offload(strategy.offload_params, ds.nvme_path),
        "overlap_comm": strategy.zero_stage == 3,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if strategy.zero_stage == 3:
        zero |= {
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_gather_16bit_weights_on_model_save": ds.save16bit_model,
        }
    config: dict[str, Any] = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    return deep_merge(config, ds.overrides)
