"""Fluent-ish builders for FineTuneJobs in tests: `job(nodes=2, zero=3, qlora=True)`."""

from typing import Any

from finetune_api.v1alpha1.resource import FineTuneJob


def job_body(
    *,
    name: str = "demo",
    namespace: str = "default",
    model: str = "meta-llama/Llama-2-7b-hf",
    nodes: int = 1,
    gpus: int = 8,
    zero: int | str = 3,
    offload_optimizer: str = "none",
    offload_params: str = "none",
    qlora: bool = False,
    overrides: dict[str, Any] | None = None,
    **spec_updates: Any,
) -> dict[str, Any]:
    """A valid manifest; `spec_updates` replace whole top-level spec sections."""
    deepspeed: dict[str, Any] = {
        "zeroStage": zero,
        "offloadOptimizer": offload_optimizer,
        "offloadParams": offload_params,
    }
    if overrides:
        deepspeed["overrides"] = overrides
    if "nvme" in (offload_optimizer, offload_params):
        deepspeed["nvmePath"] = "/local_nvme"
    spec: dict[str, Any] = {
        "model": {"name": model},
        "dataset": {"name": "org/data", "textField": "text"},
        "training": {"perDeviceTrainBatchSize": 2, "gradientAccumulationSteps": 2},
        "distributed": {"nodes": nodes, "gpusPerNode": gpus, "deepspeed": deepspeed},
    }
    if qlora:
        spec["model"]["quantization"] = {"quantType": "nf4"}
    spec.update(spec_updates)
    return {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def job(**kwargs: Any) -> FineTuneJob:
    return FineTuneJob.from_body(job_body(**kwargs))


def with_spec(path: str, value: Any, **kwargs: Any) -> dict[str, Any]:
    """A manifest from `job_body(**kwargs)` with one spec field (dotted camelCase path) set to `value`."""
    body = job_body(**kwargs)
    node = body["spec"]
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return body
