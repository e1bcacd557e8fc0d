"""spec -> accelerate.yaml: the `accelerate launch` config file, in the keys accelerate accepts.

Mirrors the seed's `deepspeed_config.yaml`: DeepSpeed plugin keys under `deepspeed_config`, with
`deepspeed_multinode_launcher: standard` so every pod runs its own torchrun. When a DeepSpeed JSON is
rendered (overrides, NVMe), the plugin points at it and drops the keys accelerate forbids beside a
JSON file. Rendezvous backend and max restarts are NOT here: accelerate ignores them in the YAML
(shared/research/trainer.md 1.4), so the node command passes them.
"""

from typing import Any

from finetune_operator.api.resource import FineTuneJob
from finetune_operator.plan import Plan
from finetune_operator.render.topology import Topology

# Keys accelerate rejects beside deepspeed_config_file (DeepSpeedPlugin._deepspeed_config_checks).
_KEYS_OWNED_BY_JSON = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
)


def render_accelerate(
    job: FineTuneJob, plan: Plan, topology: Topology, *, deepspeed_json_path: str | None
) -> dict[str, Any]:
    """The accelerate config for every node of the job (machine rank and host come from the command)."""
    spec = job.spec
    training = spec.training
    ds = spec.distributed.deepspeed
    strategy = plan.strategy
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
    }
    if strategy.zero_stage > 0:
        ds_config: dict[str, Any] = {
            "deepspeed_multinode_launcher": "standard",
            "gradient_accumulation_steps": training.gradient_accumulation_steps,
            "gradient_clipping": training.max_grad_norm,
            "offload_optimizer_device": strategy.offload_optimizer,
            "offload_param_device": strategy.offload_params,
            "zero3_init_flag": ds.zero3_init and strategy.zero_stage == 3,
            "zero3_save_16bit_model": ds.save16bit_model,
            "zero_stage": strategy.zero_stage,
        }
        if ds.nvme_path and strategy.offload_optimizer == "nvme":
            ds_config["offload_optimizer_nvme_path"] = ds.nvme_path
        if ds.nvme_path and strategy.offload_params == "nvme":
            ds_config["offload_param_nvme_path"] = ds.nvme_path
        if deepspeed_json_path is not None:
            for key in _KEYS_OWNED_BY_JSON:
                ds_config.pop(key, None)
            ds_config["deepspeed_config_file"] = deepspeed_json_path
        config["deepspeed_config"] = ds_config
        config["distributed_type"] = "DEEPSPEED"
    else:
        config["distributed_type"] = "MULTI_GPU" if topology.num_processes > 1 else "NO"
    config["downcast_bf16"] = "no"
    config["machine_rank"] = 0
    config["main_process_port"] = spec.distributed.rendezvous.port
    config["main_training_function"] = "main"
    if deepspeed_json_path is None:
        # With a JSON file, precision lives in the JSON (accelerate rejects it here).
        config["mixed_precision"] = training.mixed_precision
    config["num_machines"] = topology.num_machines
    config["num_processes"] = topology.num_processes
    config["rdzv_backend"] = spec.distributed.rendezvous.backend
    config["same_network"] = True
    config["tpu_env"] = []
    config["tpu_use_cluster"] = False
    config["tpu_use_sudo"] = False
    config["use_cpu"] = topology.use_cpu
    return config
