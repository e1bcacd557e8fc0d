"""spec + plan -> trainer.json (`finetune_api.trainer_input.TrainerInput`): what the trainer process reads.

The spec's sections travel as they are (the API's own models, defaults filled in); this module only adds what the
operator decides: where the trainer writes in its pod, the Hub target without its Secret, and the strategy (the
topology, the planner's ZeRO stage, the model's load dtype, the checkpointed layers). It never copies a spec field
by name, so a new spec option reaches the trainer without an edit here; the two the planner resolves
(`training.gradientCheckpointing: auto` and the `offloadActivations` it may add) are written as it decided.
"""

from typing import TypeVar

from finetune_api import constants
from finetune_api.trainer_input import JobIdentity, RunStrategy, TrainerInput, TrainerOutput
from finetune_api.v1alpha1.base import ApiModel
from finetune_api.v1alpha1.spec import Dtype, FineTuneJobSpec, HubTarget, ModelSource
from finetune_operator.render.context import RenderContext
from finetune_operator.render.topology import compute_topology

_DTYPE_OF_PRECISION: dict[str, Dtype] = {"bf16": "bfloat16", "fp16": "float16", "no": "float32"}

_Section = TypeVar("_Section", bound=ApiModel)


def _narrowed(section: type[_Section], value: ApiModel) -> _Section:
    """`value` (a spec model) as its base class `section`: the fields the trainer may see, secrets left behind."""
    return section.model_validate(value.model_dump(include=set(section.model_fields)))


def model_dtype(spec: FineTuneJobSpec) -> Dtype:
    """The dtype the base model is loaded in. QLoRA: the 4-bit storage dtype, so ZeRO-3 can shard the packed
    weights like any other (seed recipe); otherwise the dtype mixed precision computes in."""
    quant = spec.model.quantization
    return quant.storage_dtype if quant is not None else _DTYPE_OF_PRECISION[spec.training.mixed_precision]


def render_trainer_input(ctx: RenderContext) -> TrainerInput:
    """The trainer's input; the checkpoint directory (an option) differs only for local runs."""
    job, plan, checkpoint_dir, topology = ctx.job, ctx.plan, ctx.options.checkpoint_dir, compute_topology(ctx)
    spec = job.spec
    hub = spec.output.hub
    return TrainerInput(
        job=JobIdentity(name=job.name, namespace=job.namespace),
        model=_narrowed(ModelSource, spec.model),
        dataset=spec.dataset.model_copy(deep=True),
        adapter=spec.adapter.model_copy(deep=True),
        training=spec.training.model_copy(
            deep=True,
            update={
                "gradient_checkpointing": plan.chosen_checkpointing.enabled,
                "offload_activations": plan.chosen_checkpointing.offload,
            },
        ),
        output=TrainerOutput(
            checkpoint_dir=checkpoint_dir,
            adapter_dir=f"{checkpoint_dir}/{constants.ADAPTER_SUBDIR}",
            hub=_narrowed(HubTarget, hub) if hub is not None else None,
        ),
        strategy=RunStrategy(
            num_machines=topology.num_machines,
            num_processes=topology.num_processes,
            zero_stage=plan.strategy.zero_stage,
            use_cpu=topology.use_cpu,
            dtype=model_dtype(spec),
            checkpointed_layers=plan.chosen_checkpointing.layers if plan.chosen_checkpointing.partial else None,
        ),
    )
