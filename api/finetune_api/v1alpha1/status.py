"""FineTuneJob status: what the operator observed and decided. Written only by the operator.

`Progress` and `OutputStatus` are also what a trainer pod reports (`TrainerReport`), so they carry the
limits of untrusted input, and the generated CRD carries the same ones: numbers finite and bounded
(a JSON NaN, Infinity, "NaN" or 1e999 is refused, not stored; an integer fits int64), the step within
the planned steps, and the three output strings printable ASCII of bounded length (no NUL, ESC, CR-LF
or BEL that `kubectl describe` would print raw). Which Hub host and repo an output may name depends on
the job's spec, so that check is the progress endpoint's, not the model's.
"""

import math
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from annotated_types import MaxLen, MinLen
from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from finetune_api.v1alpha1.base import ApiModel
from finetune_api.v1alpha1.spec import HubOutput

Phase = Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
ConditionType = Literal["Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "PodsHealthy"]
"""`PodsHealthy` is False while a pod of the current attempt cannot be scheduled, cannot get its image, cannot
start its container (a missing Secret or ConfigMap), was killed for memory, crash-loops or was evicted; its
reason is the scheduler's or kubelet's (`Unschedulable`, `ErrImagePull`, `OOMKilled`, ...) and its message
quotes them. True (reason `PodsHealthy`) once no pod shows a problem."""
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})

INT64_MAX = 2**63 - 1
"""Largest step count: what Kubernetes stores as an integer (a JSON number above it is refused). The CRD says
`format: int64` rather than `maximum`: the API server reads a schema's maximum as a float64, and 2**63 - 1
rounds up past int64 there."""
METRIC_LIMIT = 1e6
"""Largest |loss|, |eval loss|, learning rate and epoch kept in status. A diverged run's loss of 1e308 says
no more than one of 1e6 and would print as noise in `kubectl get`; the trainer drops what lies outside."""
THROUGHPUT_LIMIT = 1e12
"""Largest tokens per second (all GPUs): far above any cluster."""
ETA_LIMIT = 1e10
"""Largest ETA in seconds (about 300 years)."""
URL_MAX = 2048
REVISION_MAX = 255
URL_PATTERN = r"^https?://[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+$"
"""http(s) and the characters RFC 3986 allows in a URI: no space, quote, angle bracket or control character."""
REVISION_PATTERN = r"^(?:[0-9a-f]{40}|[A-Za-z0-9][A-Za-z0-9._/-]*)$"
"""A commit id (40 hex digits) or a branch, tag or ref name (`main`, `refs/pr/1`)."""
SUMMARY_MAX = 64
SUMMARY_PATTERN = r"^[0-9a-z%/() .]*$"
"""What `Progress.summary` is made of (digits, `%`, `/`, parentheses, `step`): nothing kubectl would print raw."""
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti)?$"
"""A Kubernetes quantity in binary units, as status writes memory: `70.7Gi`, `512Mi`."""


def _repo_id_constraints() -> dict[str, Any]:
    """The spec's own `output.hub.repoId` limits, so a reported repo id cannot be looser than the spec's."""
    found: dict[str, Any] = {}
    for item in HubOutput.model_fields["repo_id"].metadata:
        if isinstance(item, MinLen):
            found["min_length"] = item.min_length
        elif isinstance(item, MaxLen):
            found["max_length"] = item.max_length
        elif getattr(item, "pattern", None):
            found["pattern"] = item.pattern
    return found


def _fits_int64(value: int) -> int:
    if value > INT64_MAX:
        raise ValueError(f"must fit in int64 (at most {INT64_MAX})")
    return value


Count = Annotated[int, Field(ge=0, strict=True, json_schema_extra={"format": "int64"}), AfterValidator(_fits_int64)]
"""A count in a report: a JSON integer (strict: not "5", not 5.5) from 0 to INT64_MAX."""


def _finite(description: str, *, ge: float, le: float) -> Any:
    """A float field that only takes a finite JSON number in [ge, le] (strict: "1.5" is not a number)."""
    return Field(default=None, ge=ge, le=le, strict=True, allow_inf_nan=False, description=description)


class Condition(ApiModel):
    """A Kubernetes-style condition (metav1.Condition shape)."""

    type: ConditionType = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, description="CamelCase reason.")
    message: str = Field(default="", max_length=32768, description="Human-readable message.")
    last_transition_time: datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(default=None, description="Generation this condition is about.")


class Progress(ApiModel):
    """Training progress, pushed by the trainer's main process."""

    step: Count = Field(default=0, description="Optimizer steps done.")
    total_steps: Count | None = Field(default=None, description="Optimizer steps planned; step never exceeds it.")
    epoch: float | None = _finite("Epochs done (fractional).", ge=0, le=METRIC_LIMIT)
    loss: float | None = _finite("Latest training loss (|loss| <= 1e6).", ge=-METRIC_LIMIT, le=METRIC_LIMIT)
    eval_loss: float | None = _finite("Latest eval loss (|loss| <= 1e6).", ge=-METRIC_LIMIT, le=METRIC_LIMIT)
    learning_rate: float | None = _finite("Current learning rate.", ge=0, le=METRIC_LIMIT)
    tokens_per_second: float | None = _finite("Training tokens per second (all GPUs).", ge=0, le=THROUGHPUT_LIMIT)
    percent: float | None = _finite("step / totalSteps, in percent.", ge=0, le=100)
    eta_seconds: float | None = _finite("Estimated seconds left.", ge=0, le=ETA_LIMIT)
    summary: str | None = Field(
        default=None,
        max_length=SUMMARY_MAX,
        pattern=SUMMARY_PATTERN,
        description="Percent and steps as people read them, e.g. 70% (7/10); the PROGRESS column of kubectl get. "
        "Set by the operator from the numbers; a trainer's own value is replaced.",
    )
    updated_at: datetime | None = Field(default=None, description="When the trainer sent this.")

    @model_validator(mode="after")
    def _step_within_plan(self) -> Self:
        if self.total_steps is not None and self.step > self.total_steps:
            raise ValueError(f"step {self.step} is beyond totalSteps {self.total_steps}")
        return self

    def ratio(self) -> float | None:
        """Fraction done, 0 to 1: `percent` when reported, else step / totalSteps; None when neither is known."""
        if self.percent is not None:
            return self.percent / 100
        if self.total_steps:
            return min(1.0, self.step / self.total_steps)
        return None

    def summary_text(self) -> str:
        """What `summary` holds: `70% (7/10)`, `70%` without totalSteps, `step 7` without either. The percent is
        rounded down, so 100% means done."""
        ratio = self.ratio()
        steps = f"{self.step}/{self.total_steps}" if self.total_steps is not None else None
        if ratio is None:
            return steps or f"step {self.step}"
        percent = f"{math.floor(ratio * 100 + 1e-9)}%"
        return f"{percent} ({steps})" if steps else percent


class PlanSummary(ApiModel):
    """What the memory planner chose, and why."""

    zero_stage: int = Field(ge=0, le=3, description="ZeRO stage in use (0 = plain data parallel).")
    offload: str = Field(description="Offload in use: none, optimizer:cpu, params:cpu, ...")
    estimated_gpu_memory: str = Field(
        alias="estimatedGPUMemory",
        max_length=32,
        pattern=QUANTITY_PATTERN,
        description="Estimated peak GPU memory per GPU, a quantity with its unit (70.7Gi, 512Mi).",
    )
    reason: str = Field(default="", max_length=1024, description="Why this strategy.")
    gradient_checkpointing: str = Field(
        default="",
        max_length=512,
        description="Activation checkpointing as planned and why: off, `11 of 32 layers`, `all 32 layers`, "
        "with `checkpoints in host memory` when offloaded; under auto, the estimates that decided it.",
    )


class OutputStatus(ApiModel):
    """Where the adapter went."""

    hub_repo: str | None = Field(default=None, **_repo_id_constraints(), description="Hub repo id (org/name).")
    revision: str | None = Field(
        default=None, max_length=REVISION_MAX, pattern=REVISION_PATTERN, description="Commit pushed (or a ref)."
    )
    url: str | None = Field(
        default=None, max_length=URL_MAX, pattern=URL_PATTERN, description="Link to the pushed commit (http/https)."
    )


class FineTuneJobStatus(ApiModel):
    """Observed state of a FineTuneJob."""

    phase: Phase = Field(
        default="Pending", description="Pending, Running, Restarting, Succeeded, Failed or Suspended."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Conditions, one per type.")
    attempt: int = Field(default=0, ge=0, description="Current attempt (1-based once started).")
    observed_generation: int | None = Field(default=None, description="Spec generation last acted on.")
    start_time: datetime | None = Field(default=None, description="When the current running period began.")
    completion_time: datetime | None = Field(default=None, description="When the job finished.")
    ready_nodes: int = Field(default=0, ge=0, description="Node pods running.")
    nodes: int | None = Field(default=None, ge=0, description="Node pods wanted.")
    progress: Progress | None = Field(default=None, description="Latest training progress.")
    plan: PlanSummary | None = Field(default=None, description="What the planner chose.")
    output: OutputStatus | None = Field(default=None, description="Pushed output.")
    restarts: int = Field(default=0, ge=0, description="Attempts restarted after a failure.")
    message: str | None = Field(default=None, max_length=32768, description="Last notable event, for people.")

    @field_validator("progress", "plan", "output", mode="wrap")
    @classmethod
    def _reported_parts_never_void_the_rest(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """A stored progress, plan or output that breaks today's limits or names (written before they existed,
        such as a plan's `estimatedGpuMemoryGiB` before `estimatedGPUMemory`) reads as absent: the trainer's next
        report or the operator's next reconcile replaces it, and the rest of the status stays readable."""
        try:
            return handler(value)
        except ValidationError:
            return None


class TrainerReport(ApiModel):
    """What the trainer's main process POSTs to the operator's progress endpoint."""

    progress: Progress | None = Field(default=None, description="Latest progress.")
    output: OutputStatus | None = Field(default=None, description="Set once the adapter is pushed.")
