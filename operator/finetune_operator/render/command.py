"""The node command, exactly as every trainer pod (and `ftjob run`) runs it: the launcher around `accelerate launch`.

`python -m finetune_trainer.launch -- accelerate launch ... -m finetune_trainer --config .../trainer.json`. The
launcher (`finetune_trainer.launch`) is what makes the trainer's permanent exit codes (64-66) the container's
exit code and stops torch elastic from restarting a worker group that failed permanently; without it the attempt
Job's podFailurePolicy could never match. This module is the one place that command is built.

Rendezvous backend, max restarts and the rendezvous timeout are command-line flags because accelerate
ignores them in its YAML. The machine rank is the Indexed Job's completion index, expanded by Kubernetes from
`$(JOB_COMPLETION_INDEX)`.
"""

from typing import Final

from finetune_api import constants
from finetune_operator.render import names
from finetune_operator.render.context import RenderContext
from finetune_operator.render.topology import compute_topology

_TIMEOUT_KEY = {"c10d": "join_timeout", "static": "timeout"}
LAUNCHER: Final = ("python", "-m", "finetune_trainer.launch", "--")
"""The launcher in front of `accelerate launch`; `ftjob run` points `python` at its own interpreter."""


def render_node_command(ctx: RenderContext) -> list[str]:
    """argv of one node; the options' machine rank is an expansion in a pod and a number in a local run
    (`RenderContext.on_local_node`)."""
    job, options, topology = ctx.job, ctx.options, compute_topology(ctx)
    config_dir = options.config_dir
    main_process_host = options.main_process_host or names.main_process_host(job, ctx.attempt)
    rdzv = job.spec.distributed.rendezvous
    return [
        *LAUNCHER,
        "accelerate",
        "launch",
        "--config_file",
        f"{config_dir}/{constants.ACCELERATE_FILE}",
        "--num_machines",
        str(topology.num_machines),
        "--num_processes",
        str(topology.num_processes),
        "--machine_rank",
        options.machine_rank,
        "--main_process_ip",
        main_process_host,
        "--main_process_port",
        str(rdzv.port),
        "--rdzv_backend",
        rdzv.backend,
        "--rdzv_conf",
        f"{_TIMEOUT_KEY[rdzv.backend]}={rdzv.timeout_seconds}",
        "--max_restarts",
        str(rdzv.max_restarts),
        "--monitor_interval",
        "1",
        "-m",
        "finetune_trainer",
        "--config",
        f"{config_dir}/{constants.TRAINER_FILE}",
    ]
