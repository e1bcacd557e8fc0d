"""spec -> trainer.json (finetune_api.trainer_input.TrainerConfig): what the trainer process reads."""

from finetune_api import constants
from finetune_api.trainer_input import (
    DataConfig,
    DistributedConfig,
    Dtype,
    HubConfig,
    JobInfo,
    LoraConfig,
    ModelConfig,
    OutputConfig,
    QuantizationConfig,
    TrainerConfig,
    TrainingConfig,
)
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.plan import Plan
from finetune_operator.render.topology import Topology

_DTYPE_OF_PRECISION: dict[str, Dtype] = {"bf16": "bfloat16", "fp16": "float16", "no": "float32"}


def render_trainer_config(
    job: FineTuneJob, plan: Plan, topology: Topology, *, checkpoint_dir: str = constants.CHECKPOINT_MOUNT
) -> TrainerConfig:
    """The trainer's config; `checkpoint_dir` differs only for local runs."""
    spec = job.spec
    model, data, training = spec.model, spec.dataset, spec.training
    quant = model.quantization
    hub = spec.output.hub
    return TrainerConfig(
        job=JobInfo(name=job.name, namespace=job.namespace),
        model=ModelConfig(
            name_or_path=model.name,
            revision=model.revision,
            attn_implementation=model.attn_implementation,
            # QLoRA: the model dtype must equal the 4-bit storage dtype so ZeRO-3 can shard it (seed recipe).
            dtype=quant.storage_dtype if quant else _DTYPE_OF_PRECISION[training.mixed_precision],
            quantization=QuantizationConfig(**quant.model_dump()) if quant else None,
            trust_remote_code=model.trust_remote_code,
        ),
        data=DataConfig(
            name_or_path=data.name,
            splits=list(data.splits),
            text_field=data.text_field,
            chat_template_format=data.chat_template_format,
            add_special_tokens=data.add_special_tokens,
            append_concat_token=data.append_concat_token,
            max_seq_len=data.max_seq_len,
            packing=data.packing,
        ),
        lora=LoraConfig(
            r=spec.adapter.r,
            alpha=spec.adapter.alpha,
            dropout=spec.adapter.dropout,
            target_modules=spec.adapter.target_modules,
        ),
        training=TrainingConfig(
            num_train_epochs=training.epochs if training.epochs is not None else 1.0,
            max_steps=training.max_steps if training.max_steps is not None else -1,
            learning_rate=training.learning_rate,
            lr_scheduler_type=training.lr_scheduler_type,
            weight_decay=training.weight_decay,
            warmup_steps=training.warmup_steps,
            max_grad_norm=training.max_grad_norm,
            per_device_train_batch_size=training.per_device_train_batch_size,
            per_device_eval_batch_size=training.per_device_eval_batch_size,
            gradient_accumulation_steps=training.gradient_accumulation_steps,
            gradient_checkpointing=training.gradient_checkpointing,
            use_reentrant=training.use_reentrant,
            offload_activations=training.offload_activations,
            mixed_precision=training.mixed_precision,
            seed=training.seed,
            logging_steps=training.logging_steps,
            eval_strategy=training.eval_strategy,
            eval_steps=training.eval_steps,
            save_strategy=training.save_strategy,
            save_steps=training.save_steps,
            save_total_limit=training.save_total_limit,
            merge_adapter=training.merge_adapter,
        ),
        output=OutputConfig(
            checkpoint_dir=checkpoint_dir,
            adapter_dir=f"{checkpoint_dir}/{constants.ADAPTER_SUBDIR}",
            hub=HubConfig(
                repo_id=hub.repo_id, private=hub.private, strategy=hub.strategy, endpoint=hub.endpoint
            )
            if hub
            else None,
        ),
        distributed=DistributedConfig(
            num_machines=topology.num_machines,
            num_processes=topology.num_processes,
            zero_stage=plan.strategy.zero_stage,
            use_cpu=topology.use_cpu,
        ),
    )
