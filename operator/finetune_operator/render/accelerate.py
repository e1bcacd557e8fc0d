"""spec -> accelerate.yaml: the `accelerate launch` config file, in the keys accelerate accepts.

The seed's `deepspeed_config.yaml` with its ZeRO keys moved into deepspeed.json: the plugin points at the
JSON (`deepspeed_config_file`) and keeps only what accelerate allows beside one - `zero3_init_flag` and
`deepspeed_multinode_launcher: standard`, so every pod runs its own torchrun; precision comes from the
JSON's "auto" (the Trainer's bf16/fp16). Rendezvous backend and max restarts are NOT here: accelerate
does not take them from its config file, so the node command passes them as flags.
"""

from typing import Any

from finetune_api import constants
from finetune_operator.render.context import RenderContext
from finetune_operator.render.deepspeed import render_deepspeed
from finetune_operator.render.topology import compute_topology


def render_accelerate(ctx: RenderContext) -> dict[str, Any]:
    """The accelerate config for every node of the job (machine rank and host come from the command); with
    DeepSpeed on, it points at deepspeed.json in the config directory."""
    spec = ctx.job.spec
    training = spec.training
    ds = spec.distributed.deepspeed
    strategy = ctx.plan.strategy
    topology = compute_topology(ctx)
    deepspeed_json_path = (
        f"{ctx.options.config_dir}/{constants.DEEPSPEED_FILE}" if render_deepspeed(ctx) is not None else None
    )
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
    }
    if deepspeed_json_path is not None:
        config["deepspeed_config"] = {
            "deepspeed_config_file": deepspeed_json_path,
            "deepspeed_multinode_launcher": "standard",
            "zero3_init_flag": ds.zero3_init and strategy.zero_stage == 3,
        }
        config["distributed_type"] = "DEEPSPEED"
    else:
        config["distributed_type"] = "MULTI_GPU" if topology.num_processes > 1 else "NO"
    config["downcast_bf16"] = "no"
    config["machine_rank"] = 0
    config["main_process_port"] = spec.distributed.rendezvous.port
    config["main_training_function"] = "main"
    if deepspeed_json_path is None:
        # With a JSON file, precision lives in the JSON (accelerate rejects it beside one).
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
