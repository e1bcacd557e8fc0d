"""The seed recipe's three scenarios render to the seed's own accelerate configs and launch flags."""

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_operator.cli import load_job
from finetune_operator.render import render_all

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "tests" / "golden" / "seed"

# Keys we add that the seed's single-node YAMLs leave out: the rendezvous port every node needs and the
# launcher every multi-node DeepSpeed run on Kubernetes needs; and where the seed's ZeRO keys went.
ALLOWED_EXTRA = {
    "main_process_port",
    "debug",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "deepspeed_config.deepspeed_multinode_launcher",
    "deepspeed_config.deepspeed_config_file",
}
# The seed's ZeRO and precision keys live in our deepspeed.json (accelerate rejects them beside one).
MOVED_TO_JSON = {
    "mixed_precision",
    "deepspeed_config.gradient_accumulation_steps",
    "deepspeed_config.gradient_clipping",
    "deepspeed_config.offload_optimizer_device",
    "deepspeed_config.offload_param_device",
    "deepspeed_config.zero3_save_16bit_model",
    "deepspeed_config.zero_stage",
}
# Questionnaire leftovers in the seed's ds_zero3_cpu.yaml, written at their defaults; we omit them.
OMITTED_DEFAULTS = {"dynamo_backend": "NO", "fsdp_config": {}, "megatron_lm_config": {}}


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat |= flatten(value, f"{path}.")
        else:
            flat[path] = value
    return flat


def deepspeed_config_of(launch_config: dict[str, Any], deepspeed_json: dict[str, Any] | None) -> dict[str, Any]:
    """The DeepSpeed config accelerate's own plugin builds for a launch config: from its inline ZeRO keys (the
    seed) or from the JSON its `deepspeed_config_file` names (ours)."""
    from accelerate.utils import DeepSpeedPlugin

    keys = dict(launch_config["deepspeed_config"])
    keys.pop("deepspeed_multinode_launcher", None)
    if keys.pop("deepspeed_config_file", None) is not None:
        keys["hf_ds_config"] = copy.deepcopy(deepspeed_json)
    return dict(DeepSpeedPlugin(**keys).deepspeed_config)


def without_nulls(config: dict[str, Any]) -> dict[str, Any]:
    """accelerate writes `nvme_path: None` for non-NVMe offload; DeepSpeed's default for an absent key is None."""
    return {k: without_nulls(v) if isinstance(v, dict) else v for k, v in config.items() if v is not None}


CASES = [
    ("examples/llama-70b-lora-zero3.yaml", "lora_zero3_8gpu.yaml"),
    ("examples/llama-70b-qlora-zero3.yaml", "qlora_zero3_2gpu.yaml"),
    ("examples/llama-7b-zero3-offload-1gpu.yaml", "zero3_offload_1gpu.yaml"),
]
IDS = ["70B LoRA ZeRO-3 8 GPUs", "70B QLoRA ZeRO-3 2 GPUs", "ZeRO-3 CPU offload 1 GPU"]


@pytest.mark.parametrize(("example", "seed_file"), CASES, ids=IDS)
def test_accelerate_config_equals_the_seed_key_by_key(example: str, seed_file: str) -> None:
    seed = flatten(yaml.safe_load((SEED / seed_file).read_text()))
    rendered = flatten(render_all(load_job(str(ROOT / example))).accelerate)
    for key, default in OMITTED_DEFAULTS.items():
        assert seed.pop(key, default) == default
    kept = {k: v for k, v in seed.items() if k not in MOVED_TO_JSON}
    assert {k: rendered.get(k) for k in kept} == kept
    assert set(rendered) - set(seed) <= ALLOWED_EXTRA


@pytest.mark.parametrize(("example", "seed_file"), CASES, ids=IDS)
def test_deepspeed_json_gives_accelerate_the_seeds_zero_config(example: str, seed_file: str) -> None:
    """accelerate's plugin builds the same ZeRO config from our deepspeed.json as from the seed's inline keys;
    what the JSON leaves "auto" the HF Trainer fills from trainer.json, which carries the seed's values."""
    seed = yaml.safe_load((SEED / seed_file).read_text())
    rendered = render_all(load_job(str(ROOT / example)))
    ours = deepspeed_config_of(rendered.accelerate, rendered.deepspeed)
    theirs = deepspeed_config_of(seed, None)
    assert ours["zero_optimization"] == without_nulls(theirs["zero_optimization"])
    assert ours["gradient_accumulation_steps"] == ours["gradient_clipping"] == "auto"
    if theirs["gradient_accumulation_steps"] != "auto":
        assert rendered.trainer.training.gradient_accumulation_steps == theirs["gradient_accumulation_steps"]
    assert ours["bf16"] == ours["fp16"] == {"enabled": "auto"}
    assert rendered.trainer.training.mixed_precision == seed["mixed_precision"]
    assert rendered.accelerate["deepspeed_config"]["zero3_init_flag"] == seed["deepspeed_config"]["zero3_init_flag"]


# The seed's launch flags (run_peft_deepspeed.sh and run_peft_qlora_deepspeed_stage3.sh) -> trainer.json.
COMMON_FLAGS = {
    "training.seed": 100,
    "model.name": "meta-llama/Llama-2-70b-hf",
    "dataset.name": "smangrul/ultrachat-10k-chatml",
    "dataset.chatTemplateFormat": "chatml",
    "dataset.addSpecialTokens": False,
    "dataset.appendConcatToken": False,
    "dataset.splits": ["train", "test"],
    "dataset.maxSeqLen": 2048,
    "training.epochs": 1,
    "training.loggingSteps": 5,
    "training.evalStrategy": "epoch",
    "training.saveStrategy": "epoch",
    "output.hub.private": True,
    "output.hub.strategy": "every_save",
    "training.mixedPrecision": "bf16",
    "dataset.packing": True,
    "training.learningRate": 1e-4,
    "training.lrSchedulerType": "cosine",
    "training.weightDecay": 1e-4,
    "training.warmupSteps": 0,
    "training.maxGradNorm": 1.0,
    "training.gradientCheckpointing": True,
    "dataset.textField": "content",
    "model.attnImplementation": "flash_attention_2",
    "adapter.r": 8,
    "adapter.alpha": 16,
    "adapter.dropout": 0.1,
    "adapter.targetModules": "all-linear",
}
LORA_FLAGS = COMMON_FLAGS | {
    "training.perDeviceTrainBatchSize": 8,
    "training.perDeviceEvalBatchSize": 8,
    "training.gradientAccumulationSteps": 4,
    "training.useReentrant": False,
    "model.quantization": None,
}
QLORA_FLAGS = COMMON_FLAGS | {
    "training.perDeviceTrainBatchSize": 2,
    "training.perDeviceEvalBatchSize": 2,
    "training.gradientAccumulationSteps": 2,
    "training.useReentrant": True,
    "model.quantization.quantType": "nf4",
    "model.quantization.doubleQuant": True,
    "model.quantization.computeDtype": "bfloat16",
    "model.quantization.storageDtype": "bfloat16",
    "strategy.dtype": "bfloat16",  # the model's dtype follows bnb_4bit_quant_storage, as the seed insists
}


@pytest.mark.parametrize(
    ("example", "flags"),
    [
        ("examples/llama-70b-lora-zero3.yaml", LORA_FLAGS),
        ("examples/llama-70b-qlora-zero3.yaml", QLORA_FLAGS),
    ],
    ids=["LoRA launch flags", "QLoRA launch flags"],
)
def test_trainer_config_equals_the_seed_launch_flags(example: str, flags: dict[str, Any]) -> None:
    trainer = render_all(load_job(str(ROOT / example))).trainer.to_dict()
    got = {}
    for path in flags:
        node: Any = trainer
        for part in path.split("."):
            node = node[part] if node is not None else None
        got[path] = node
    assert got == flags
