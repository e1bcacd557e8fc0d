"""The planner: estimates by component and the `auto` choice."""

import itertools

import pytest

from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.status import FineTuneJobStatus
from finetune_operator.plan import (
    FIT_MARGIN,
    GIB,
    Checkpointing,
    Strategy,
    estimate_memory,
    lora_parameter_count,
    plan_job,
)
from finetune_operator.planreport import format_plan
from finetune_operator.status import plan_summary
from tests.builders import job


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"model": "meta-llama/Meta-Llama-3-8B", "zero": "auto"}, Strategy(0)),
        ({"model": "meta-llama/Llama-2-70b-hf", "zero": "auto"}, Strategy(3)),
        ({"model": "meta-llama/Llama-2-70b-hf", "zero": "auto", "qlora": True}, Strategy(0)),
        ({"model": "meta-llama/Llama-2-70b-hf", "zero": "auto", "gpus": 2}, Strategy(3, "cpu", "cpu")),
    ],
    ids=[
        "a LoRA run of an 8B model that fits one GPU is plain data parallel",
        "70B bf16 on 8 GPUs needs parameter sharding",
        "70B in 4 bit fits each GPU without sharding",
        "70B bf16 on 2 GPUs needs parameters and optimizer offloaded to CPU",
    ],
)
def test_auto_picks_the_lowest_stage_that_fits(kwargs: dict[str, object], expected: Strategy) -> None:
    plan = plan_job(job(**kwargs).spec)  # type: ignore[arg-type]
    assert plan.strategy == expected
    assert plan.fits and "lowest ZeRO stage that fits" in plan.reason


def test_lora_parameters_of_llama2_70b_all_linear() -> None:
    spec = job(model="meta-llama/Llama-2-70b-hf").spec
    # r * (in + out) per linear; GQA k/v project 8192 -> 1024.
    per_layer = 8 * ((8192 + 8192) * 2 + (8192 + 1024) * 2 + (8192 + 28672) * 3)
    assert lora_parameter_count(spec, plan_job(spec).shape) == per_layer * 80


def test_zero3_shards_the_base_weights_and_offload_removes_them() -> None:
    spec = job(model="meta-llama/Llama-2-70b-hf").spec
    shape = plan_job(spec).shape
    replicated = estimate_memory(spec, shape, Strategy(2)).parts["base weights"]
    sharded = estimate_memory(spec, shape, Strategy(3)).parts["base weights (sharded)"]
    offloaded = estimate_memory(spec, shape, Strategy(3, "cpu", "cpu")).parts["base weights (sharded)"]
    assert replicated == pytest.approx(shape.num_parameters * 2)
    assert sharded == pytest.approx(replicated / 8)
    assert offloaded == 0


def test_checkpointing_cuts_activation_memory() -> None:
    on = job(model="meta-llama/Llama-2-7b-hf").spec
    off = on.model_copy(update={"training": on.training.model_copy(update={"gradient_checkpointing": False})})
    shape = plan_job(on).shape
    with_ckpt = estimate_memory(on, shape, Strategy(3)).parts["activations (checkpointed)"]
    without = estimate_memory(off, shape, Strategy(3)).parts["activations"]
    assert without > 10 * with_ckpt > 0
    assert with_ckpt / GIB < 2


def test_offloading_activations_moves_the_checkpoints_off_the_gpu() -> None:
    """70B at the seed's batch (8 x 2048): the checkpointed hidden states (80 x 16384 x 8192 x 2 bytes = 20 GiB)
    leave the GPU; the layer being recomputed stays."""
    spec = job(model="meta-llama/Llama-2-70b-hf", gpus=4).spec
    seed_batch = spec.training.model_copy(update={"per_device_train_batch_size": 8})
    on_gpu = spec.model_copy(update={"training": seed_batch})
    offloaded = spec.model_copy(update={"training": seed_batch.model_copy(update={"offload_activations": True})})
    shape = plan_job(on_gpu).shape
    kept = estimate_memory(on_gpu, shape, Strategy(3))
    moved = estimate_memory(offloaded, shape, Strategy(3))
    assert kept.parts["activations (checkpointed)"] == 80 * 8 * 2048 * 8192 * 2
    assert "activations (checkpointed)" not in moved.parts
    assert moved.parts["activations (layer in recompute)"] == kept.parts["activations (layer in recompute)"] > 0
    assert kept.total_gib - moved.total_gib == pytest.approx(20.0)


def test_qlora_under_zero3_loads_partitioned_so_the_step_is_the_peak() -> None:
    """The trainer partitions each 4-bit weight as transformers quantizes it (70B on 2 GPUs, measured: 18.5 GiB
    allocated while loading, 23.0-28.4 in the step; before, every GPU held the whole 4-bit model: 34.3)."""
    spec = job(model="meta-llama/Llama-2-70b-hf", gpus=2, qlora=True).spec
    plan = plan_job(spec)
    estimate = estimate_memory(spec, plan.shape, Strategy(3))
    assert estimate.loading == 0
    assert estimate.peak_gib == estimate.total_gib


def test_zero3_without_zero_init_also_loads_the_whole_model_on_each_gpu() -> None:
    spec = job(model="meta-llama/Llama-2-70b-hf", gpus=8).spec
    shape = plan_job(spec).shape
    assert estimate_memory(spec, shape, Strategy(3)).loading == 0  # zero.Init: partitioned while it is built
    no_init = spec.distributed.deepspeed.model_copy(update={"zero3_init": False})
    spec = spec.model_copy(update={"distributed": spec.distributed.model_copy(update={"deepspeed": no_init})})
    assert estimate_memory(spec, shape, Strategy(3)).loading / GIB > shape.num_parameters * 2 / GIB


def _one_gpu_8b(batch: int, gpu_gib: float = 140, **training: object) -> FineTuneJob:
    """The bench workload (Llama-3-8B shape, LoRA r=8, seq 2048) on one GPU, as a user writes it."""
    return job(
        model="meta-llama/Meta-Llama-3-8B",
        gpus=1,
        zero="auto",
        dataset={"name": "org/data", "textField": "text", "maxSeqLen": 2048},
        training={"perDeviceTrainBatchSize": batch, **training},
        distributed={"nodes": 1, "gpusPerNode": 1, "gpuMemoryGiB": gpu_gib, "deepspeed": {"zeroStage": "auto"}},
    )


def test_auto_checkpointing_is_the_default_and_off_when_the_step_fits() -> None:
    """4 x 2048 tokens of 8B on a 140 GiB GPU: 70.7 GiB without checkpointing (measured 68.7 on the device) fits
    90% of the GPU, so nothing is recomputed."""
    spec = _one_gpu_8b(4).spec
    assert spec.training.gradient_checkpointing == "auto"
    plan = plan_job(spec)
    assert plan.checkpointing == Checkpointing(0, 32)
    assert plan.estimate.peak_gib == pytest.approx(70.7, abs=0.1)
    assert plan.estimate.parts["activations"] == 8192 * 32 * (8 * 4096 + 5 * 14336) * 2
    assert plan.checkpointing_summary.startswith("off: auto: 70.7 GiB fits 90% of 140 GiB")


def test_auto_checkpoints_the_fewest_layers_that_fit() -> None:
    """The same job told its GPU has 60 GiB: 11 of 32 layers is the fewest that fit (53.9 GiB; 10 need 55.4 > 54).
    Measured (bench run 13): 51.9 GiB on the device."""
    spec = _one_gpu_8b(4, gpu_gib=60).spec
    plan = plan_job(spec)
    assert plan.checkpointing == Checkpointing(11, 32)
    assert plan.fits and plan.estimate.peak_gib == pytest.approx(53.9, abs=0.1)
    ten = estimate_memory(spec, plan.shape, plan.strategy, Checkpointing(10, 32))
    assert ten.peak_gib > 60 * FIT_MARGIN >= plan.estimate.peak_gib
    assert "11 of 32 layers: auto" in plan.checkpointing_summary and "10 of 32 layers" in plan.checkpointing_summary
    per_layer_full = 8192 * (8 * 4096 + 5 * 14336) * 2
    assert plan.estimate.parts["activations (layers not checkpointed)"] == 21 * per_layer_full
    assert plan.estimate.parts["activations (checkpointed)"] == 11 * 8192 * 4096 * 2
    assert "activations (layer in recompute)" not in plan.estimate.parts


def test_auto_checkpoints_every_layer_then_offloads_when_less_is_not_enough() -> None:
    """26 GiB: 31 of 32 layers (23.3 GiB); 25 GiB: every layer (21.7 GiB: the kept hidden states plus what one
    layer's recompute needs beyond the logits, which are freed before it; measured in bench run 13: 21.1 GiB on the
    device); 24 GiB: every layer with the checkpoints in host memory (19.7 GiB)."""
    assert plan_job(_one_gpu_8b(4, gpu_gib=26).spec).checkpointing == Checkpointing(31, 32)
    every = plan_job(_one_gpu_8b(4, gpu_gib=25).spec)
    assert every.checkpointing == Checkpointing(32, 32)
    assert every.estimate.peak_gib == pytest.approx(21.7, abs=0.1)
    # one layer's recompute (1.59 GiB) fits in what the logits held (1.96 GiB at a 128k vocabulary)
    assert every.estimate.parts["logits + loss"] > 8192 * (8 * 4096 + 5 * 14336) * 2
    assert every.estimate.parts["activations (layer in recompute)"] == 0
    offloaded = plan_job(_one_gpu_8b(4, gpu_gib=24).spec)
    assert offloaded.checkpointing == Checkpointing(32, 32, offload=True)
    assert "activations (checkpointed)" not in offloaded.estimate.parts
    assert offloaded.estimate.total < every.estimate.total
    assert offloaded.checkpointing_summary.startswith("all 32 layers, checkpoints in host memory: auto: 19.7 GiB")


def test_more_layers_checkpointed_never_needs_more_memory() -> None:
    spec = _one_gpu_8b(16).spec
    shape = plan_job(spec).shape
    peaks = [estimate_memory(spec, shape, Strategy(0), Checkpointing(n, 32)).peak_gib for n in range(33)]
    assert all(a > b for a, b in itertools.pairwise(peaks))
    assert peaks[0] > 200 > 50 > peaks[32]


def test_explicit_checkpointing_is_kept_even_when_auto_would_choose_otherwise() -> None:
    on = plan_job(_one_gpu_8b(4, gradientCheckpointing=True).spec)
    assert on.checkpointing == Checkpointing(32, 32) and on.checkpointing_reason == "as requested"
    with pytest.raises(InvalidSpecError, match="no ZeRO strategy fits 60 GiB"):
        plan_job(_one_gpu_8b(4, gpu_gib=60, gradientCheckpointing=False).spec)
    offload = plan_job(_one_gpu_8b(4, offloadActivations=True).spec)
    assert offload.checkpointing == Checkpointing(32, 32, offload=True)


def test_auto_checkpointing_is_tried_at_each_zero_stage_before_the_next() -> None:
    """70B LoRA on 8 GPUs at the seed's batch: ZeRO-0..2 cannot hold the bf16 model whatever is checkpointed; ZeRO-3
    fits, and there checkpointing decides: 8 x 2048 tokens need some layers checkpointed."""
    spec = job(model="meta-llama/Llama-2-70b-hf", zero="auto", gpus=8, training={"perDeviceTrainBatchSize": 8}).spec
    plan = plan_job(spec)
    assert plan.strategy == Strategy(3)
    assert plan.chosen_checkpointing.enabled and plan.fits
    assert "ZeRO" not in plan.checkpointing_summary


def test_a_cpu_job_with_auto_checkpointing_recomputes_nothing() -> None:
    spec = job(model="builtin:tiny-llama", gpus=0, zero=0).spec
    plan = plan_job(spec)
    assert plan.checkpointing == Checkpointing(0, 2)
    assert "CPU job" in plan.checkpointing_summary


def test_status_plan_and_ftjob_plan_say_what_auto_chose_and_why() -> None:
    job_ = _one_gpu_8b(4, gpu_gib=60)
    plan = plan_job(job_.spec)
    summary = plan_summary(plan)
    assert summary.gradient_checkpointing == plan.checkpointing_summary
    assert summary.gradient_checkpointing.startswith(
        "11 of 32 layers: auto: 53.9 GiB fits 90% of 60 GiB (off: 70.7 GiB"
    )
    assert FineTuneJobStatus.model_validate({"plan": summary.model_dump(by_alias=True)}).plan == summary
    report = format_plan(job_, plan)
    assert f"  checkpointing     {plan.checkpointing_summary}" in report.splitlines()
