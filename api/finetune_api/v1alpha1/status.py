"""FineTuneJob status: what the operator observed and decided. Written only by the operator."""

from datetime import datetime
from typing import Literal

from pydantic import Field

from finetune_api.v1alpha1.base import ApiModel

Phase = Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
ConditionType = Literal["Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})


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

    step: int = Field(default=0, ge=0, description="Optimizer steps done.")
    total_steps: int | None = Field(default=None, ge=0, description="Optimizer steps planned.")
    epoch: float | None = Field(default=None, ge=0, description="Epochs done (fractional).")
    loss: float | None = Field(default=None, description="Latest training loss.")
    eval_loss: float | None = Field(default=None, description="Latest eval loss.")
    learning_rate: float | None = Field(default=None, description="Current learning rate.")
    tokens_per_second: float | None = Field(
        default=None, ge=0, description="Training tokens per second (all GPUs)."
    )
    percent: float | None = Field(default=None, ge=0, le=100, description="step / totalSteps, in percent.")
    eta_seconds: float | None = Field(default=None, ge=0, description="Estimated seconds left.")
    updated_at: datetime | None = Field(default=None, description="When the trainer sent this.")


class PlanSummary(ApiModel):
    """What the memory planner chose, and why."""

    zero_stage: int = Field(ge=0, le=3, description="ZeRO stage in use (0 = plain data parallel).")
    offload: str = Field(description="Offload in use: none, optimizer:cpu, params:cpu, ...")
    estimated_gpu_memory_gi_b: float = Field(
        alias="estimatedGpuMemoryGiB", ge=0, description="Estimated peak GPU memory per GPU, GiB."
    )
    reason: str = Field(default="", max_length=1024, description="Why this strategy.")


class OutputStatus(ApiModel):
    """Where the adapter went."""

    hub_repo: str | None = Field(default=None, description="Hub repo id.")
    revision: str | None = Field(default=None, description="Commit pushed.")
    url: str | None = Field(default=None, description="Link to the pushed commit.")


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


class TrainerReport(ApiModel):
    """What the trainer's main process POSTs to the operator's progress endpoint."""

    progress: Progress | None = Field(default=None, description="Latest progress.")
    output: OutputStatus | None = Field(default=None, description="Set once the adapter is pushed.")
