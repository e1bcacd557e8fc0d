"""Human-readable text of a Plan: `ftjob plan`'s report, and the memory quantity that status shows. Pure."""

from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.plan import FIT_MARGIN, GIB, Plan


def memory_quantity(gib: float) -> str:
    """GiB as a Kubernetes quantity with its unit in the value, as `kubectl describe` shows it well:
    `70.7Gi` (one decimal), or `512Mi` below 1 GiB (so a small CPU job does not read `0.0Gi`)."""
    if gib >= 1:
        return f"{gib:.1f}Gi"
    return f"{max(0.0, gib) * 1024:.0f}Mi"


def format_plan(job: FineTuneJob, plan: Plan) -> str:
    spec = job.spec
    dist = spec.distributed
    shape = plan.shape
    gpus = dist.nodes * dist.gpus_per_node
    lines = [
        f"job {job.namespace}/{job.name}: {spec.model.name}"
        + (" (QLoRA 4-bit)" if spec.model.quantization else " (LoRA)"),
        f"  parameters        {shape.num_parameters / 1e9:.2f} B  (hidden {shape.hidden_size}, "
        f"{shape.num_layers} layers, vocab {shape.vocab_size})",
        f"  lora parameters   {plan.lora_parameters / 1e6:.2f} M  (r={spec.adapter.r}, "
        f"targets={spec.adapter.target_modules})",
        f"  gpus              {dist.nodes} node(s) x {dist.gpus_per_node} = {gpus}, {dist.gpu_memory_gi_b:g} GiB each"
        if gpus
        else f"  cpu               {dist.nodes} node(s) x {dist.processes_per_node} process(es), no GPU",
        f"  tokens per gpu    {spec.training.per_device_train_batch_size} x {spec.dataset.max_seq_len}",
        f"  checkpointing     {plan.checkpointing_summary}",
        f"  strategy          ZeRO-{plan.strategy.zero_stage}"
        + (" (plain data parallel)" if plan.strategy.zero_stage == 0 else "")
        + f", offload {plan.strategy.offload}",
        f"  why               {plan.reason}",
        "  per-GPU estimate:",
    ]
    lines += [f"    {name:<28} {value / GIB:8.2f} GiB" for name, value in plan.estimate.parts.items()]
    verdict = "fits" if plan.fits else f"does NOT fit ({FIT_MARGIN:.0%} of {plan.gpu_memory_gib:g} GiB)"
    loading = plan.estimate.loading / GIB
    if loading > plan.estimate.total_gib:
        lines.append(f"    {'total of the step':<28} {plan.estimate.total_gib:8.2f} GiB")
        lines.append(f"    {'loading (whole model)':<28} {loading:8.2f} GiB  -> {verdict}")
    else:
        lines.append(f"    {'total':<28} {plan.estimate.total_gib:8.2f} GiB  -> {verdict}")
    return "\n".join(lines)
