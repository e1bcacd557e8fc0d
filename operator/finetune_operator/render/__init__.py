"""Pure renderers: a FineTuneJob in, every file and manifest of its run out. No I/O, no kopf.

`render_all` is the one entry point the handlers, `ftjob render` and `ftjob run` call, which is why
the ConfigMap and `ftjob render` match byte for byte. Order: validate (the spec's rules and the
options' pod policy) -> plan -> topology -> deepspeed.json -> accelerate.yaml -> trainer.json ->
node command -> ConfigMap, Service, Job.
"""

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from finetune_api import constants
from finetune_api.trainer_input import TrainerInput
from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.plan import Plan, plan_job
from finetune_operator.policy import PodPolicy
from finetune_operator.render import names
from finetune_operator.render.accelerate import render_accelerate
from finetune_operator.render.command import render_node_command
from finetune_operator.render.deepspeed import render_deepspeed
from finetune_operator.render.topology import Topology, compute_topology
from finetune_operator.render.trainer_config import render_trainer_input
from finetune_operator.render.workload import render_config_map, render_job, render_service
from finetune_operator.validation import check_job


@dataclass(frozen=True)
class RenderOptions:
    """Inputs that come from the operator's deployment, not the job."""

    image: str = constants.DEFAULT_TRAINER_IMAGE
    policy: PodPolicy = field(default_factory=PodPolicy)
    """What `spec.template` may ask for (`ftjob operator` flags); a job beyond it is an InvalidSpecError."""
    progress_url: str | None = None
    progress_ca: str | None = None  # PEM the trainer pins for progress_url (put in the ConfigMap)
    attempt: int = 1
    config_dir: str = constants.CONFIG_MOUNT
    checkpoint_dir: str = constants.CHECKPOINT_MOUNT


@dataclass(frozen=True)
class Rendered:
    """Everything one job becomes."""

    plan: Plan
    topology: Topology
    accelerate: dict[str, Any]
    deepspeed: dict[str, Any] | None
    trainer: TrainerInput
    files: dict[str, str]
    command: list[str]
    config_map: dict[str, Any]
    service: dict[str, Any]
    job: dict[str, Any]

    @property
    def manifests(self) -> list[dict[str, Any]]:
        """The children in the order they are applied (and `ftjob render` writes them)."""
        return [self.config_map, self.service, self.job]


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the files inside the ConfigMap) as readable `|` blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_BlockDumper, sort_keys=True, default_flow_style=False, width=120)


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def escape_astral(json_text: str) -> str:
    """Characters beyond U+FFFF (emoji) as JSON surrogate escapes: same JSON, and it survives the server-side
    apply of the ConfigMap, whose JSON-as-YAML body the apiserver's YAML decoder rejects with them escaped."""
    return _ASTRAL.sub(lambda m: json.dumps(m.group())[1:-1], json_text)


def render_files(
    accelerate: dict[str, Any], deepspeed: dict[str, Any] | None, trainer: TrainerInput
) -> dict[str, str]:
    """The config files, serialized once, so every consumer gets the same bytes."""
    files = {
        constants.ACCELERATE_FILE: dump_yaml(accelerate),
        constants.TRAINER_FILE: escape_astral(trainer.to_json()) + "\n",
    }
    if deepspeed is not None:
        files[constants.DEEPSPEED_FILE] = json.dumps(deepspeed, indent=2, sort_keys=True) + "\n"
    return files


def render_all(job: FineTuneJob, options: RenderOptions | None = None) -> Rendered:
    """Validate, plan and render one job; raise InvalidSpecError listing every problem."""
    options = options or RenderOptions()
    errors = check_job(job, options.policy)
    if errors:
        raise InvalidSpecError(errors)
    plan = plan_job(job.spec)
    topology = compute_topology(job)
    deepspeed = render_deepspeed(job, plan)
    accelerate = render_accelerate(
        job,
        plan,
        topology,
        deepspeed_json_path=f"{options.config_dir}/{constants.DEEPSPEED_FILE}" if deepspeed is not None else None,
    )
    trainer = render_trainer_input(job, plan, topology, checkpoint_dir=options.checkpoint_dir)
    files = render_files(accelerate, deepspeed, trainer)
    ca_file = None
    if options.progress_url and options.progress_ca:
        files[constants.PROGRESS_CA_FILE] = options.progress_ca
        ca_file = f"{options.config_dir}/{constants.PROGRESS_CA_FILE}"
    command = render_node_command(
        job,
        topology,
        main_process_host=names.main_process_host(job, options.attempt),
        config_dir=options.config_dir,
    )
    config_map = render_config_map(job, files)
    service = render_service(job)
    attempt_job = render_job(
        job,
        options.attempt,
        topology,
        command,
        image=options.image,
        progress_url=options.progress_url,
        progress_ca_file=ca_file,
    )
    return Rendered(
        plan=plan,
        topology=topology,
        accelerate=accelerate,
        deepspeed=deepspeed,
        trainer=trainer,
        files=files,
        command=command,
        config_map=config_map,
        service=service,
        job=attempt_job,
    )


def render_or_errors(job: FineTuneJob, options: RenderOptions | None = None) -> Rendered | InvalidSpecError:
    """`render_all` with its InvalidSpecError as a value (the plan does not depend on the render options; whether
    the job is valid does, through the pod policy)."""
    try:
        return render_all(job, options)
    except InvalidSpecError as exc:
        return exc
