"""spec -> deepspeed.json: the whole DeepSpeed config of a job, whenever DeepSpeed runs (ZeRO stage >= 1).

accelerate reads it through `deepspeed_config_file`, so it is the one place the ZeRO settings live. Its base
is exactly the config accelerate's plugin builds from its own YAML keys (the seed's `deepspeed_config.yaml`
route, measured on GPUs): stage, offload devices, 16-bit gather on save, and "auto" wherever the HF Trainer
fills values from its own arguments (batch sizes, accumulation, clipping, precision), so the JSON and
trainer.json can never disagree. `distributed.deepspeed.overrides` is merged last, for experts.
"""

from typing import Any

from finetune_operator.render.context import RenderContext


def _offload(device: str, nvme_path: str | None) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device}
    if device == "nvme" and nvme_path:
        block["nvme_path"] = nvme_path
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


def render_deepspeed(ctx: RenderContext) -> dict[str, Any] | None:
    """The DeepSpeed JSON, or None when DeepSpeed is off (ZeRO stage 0: plain data parallel)."""
    ds = ctx.job.spec.distributed.deepspeed
    strategy = ctx.plan.strategy
    if strategy.zero_stage == 0:
        return None
    config: dict[str, Any] = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": strategy.zero_stage,
            "offload_optimizer": _offload(strategy.offload_optimizer, ds.nvme_path),
            "offload_param": _offload(strategy.offload_params, ds.nvme_path),
            "stage3_gather_16bit_weights_on_model_save": ds.save16bit_model,
        },
    }
    return deep_merge(config, ds.overrides)
