"""Pure renderers: an admitted FineTuneJob for one attempt in, every file and manifest of its run out. No I/O, no kopf.

`render(ctx)` is the one entry point the operator's reconcile, `ftjob render` and `ftjob run` call, which is why
the ConfigMap and `ftjob render` match byte for byte. It takes a `RenderContext` (the job, its admission from
`finetune_operator.admit`, the attempt, the options), the one argument of every renderer here; validation and
planning happened before, in admission, so rendering cannot fail on a spec. Order: topology -> deepspeed.json ->
accelerate.yaml -> trainer.json -> files -> node command -> ConfigMap, Service, Job. `render_all(job, options)`
is admission and rendering in one call, for callers that hold a job and no admission yet (tests, benchmarks).
"""

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from finetune_api.trainer_input import TrainerInput
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.admit import admit_or_raise
from finetune_operator.plan import Plan
from finetune_operator.render.accelerate import render_accelerate
from finetune_operator.render.command import render_node_command
from finetune_operator.render.context import RenderContext, RenderOptions
from finetune_operator.render.deepspeed import render_deepspeed
from finetune_operator.render.files import dump_yaml, escape_astral, render_files
from finetune_operator.render.topology import Topology, compute_topology
from finetune_operator.render.trainer_config import render_trainer_input
from finetune_operator.render.workload import render_config_map, render_job, render_service

__all__ = [
    "RenderContext",
    "RenderOptions",
    "Rendered",
    "dump_yaml",
    "escape_astral",
    "render",
    "render_all",
    "render_files",
    "spec_digest",
]


@dataclass(frozen=True)
class Rendered:
    """Everything one job becomes for one attempt."""

    context: RenderContext
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

    @cached_property
    def job_digest(self) -> str:
        """`spec_digest` of the attempt Job, once per rendering: a round compares it with the live Job's every
        time, and renderings are memoized per spec (`render.memo.RenderMemo`), so rounds reuse it."""
        return spec_digest(self.job)

    @property
    def manifests(self) -> list[dict[str, Any]]:
        """The children in the order they are applied (and `ftjob render` writes them)."""
        return [self.config_map, self.service, self.job]


def spec_digest(attempt_job: dict[str, Any]) -> str:
    """A short hash of an attempt Job's spec without `suspend` (the operator's to flip, not an edit): the
    template-hash annotation that tells a Job rendered from an older spec (`reconcile.with_template_hash`)."""
    spec = {k: v for k, v in attempt_job["spec"].items() if k != "suspend"}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def render(ctx: RenderContext) -> Rendered:
    """Every part of one admitted job's run for the context's attempt. The files are serialized once, inside the
    ConfigMap (most of a rendering's time); the small parts they are made of are rendered again for `Rendered`."""
    config_map = render_config_map(ctx)
    return Rendered(
        context=ctx,
        plan=ctx.plan,
        topology=compute_topology(ctx),
        accelerate=render_accelerate(ctx),
        deepspeed=render_deepspeed(ctx),
        trainer=render_trainer_input(ctx),
        files=dict(config_map["data"]),
        command=render_node_command(ctx),
        config_map=config_map,
        service=render_service(ctx),
        job=render_job(ctx),
    )


def render_all(job: FineTuneJob, options: RenderOptions | None = None, *, attempt: int = 1) -> Rendered:
    """Admit (under the options' pod policy), then render; raise InvalidSpecError listing every problem."""
    options = options or RenderOptions()
    return render(RenderContext(job, admit_or_raise(job, options.policy), attempt, options))
