"""Cross-field rules on a parsed spec, all collected at once, and the operator's pod policy.

The CRD's CEL rules say most of these at `kubectl apply`; this module says them again (and the ones
CEL cannot, such as reserved env names) so `ftjob render`, `ftjob run` and the operator reject the
same specs with the same words. The template rules that need no configuration are here too (reserved
label keys and a toleration of every taint, with the CRD's own path and message; env Secret references,
which CEL cannot read in free-form env entries); the ones that depend on the operator's flags are
`finetune_operator.policy`'s, checked with the rest. Pure: no I/O, no Kubernetes.
"""

from collections.abc import Callable

from pydantic import BaseModel

from finetune_api import constants
from finetune_api.v1alpha1.errors import FieldError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.spec import (
    RESERVED_LABELS_MESSAGE,
    TOLERATE_EVERYTHING_MESSAGE,
    FineTuneJobSpec,
    SecretKeyRef,
)
from finetune_operator.policy import PodPolicy, check_pod_policy

DS = "spec.distributed.deepspeed"

# DeepSpeed keys the spec owns: an override of one would make the rendered files disagree.
OWNED_OVERRIDES = {
    ("zero_optimization", "stage"): "zeroStage",
    ("zero_optimization", "offload_optimizer", "device"): "offloadOptimizer",
    ("zero_optimization", "offload_param", "device"): "offloadParams",
    ("train_micro_batch_size_per_gpu",): "spec.training.perDeviceTrainBatchSize",
    ("gradient_accumulation_steps",): "spec.training.gradientAccumulationSteps",
    ("train_batch_size",): "spec.training.perDeviceTrainBatchSize and gradientAccumulationSteps",
}


def _lookup(data: dict[str, object], path: tuple[str, ...]) -> bool:
    node: object = data
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def declared_secret_refs(spec: FineTuneJobSpec) -> dict[tuple[str, str], str]:
    """Every Secret key the spec names outside its template, (name, key) -> the field naming it: the Secrets
    the job declares as its own, found by walking the model so that a new `SecretKeyRef` field counts too."""
    found: dict[tuple[str, str], str] = {}

    def walk(node: object, path: str) -> None:
        if isinstance(node, SecretKeyRef):
            found.setdefault((node.name, node.key), path)
        elif isinstance(node, BaseModel):
            for name, field in type(node).model_fields.items():
                if path == "spec" and name == "template":
                    continue
                walk(getattr(node, name), f"{path}.{field.alias or name}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{path}[{i}]")

    walk(spec, "spec")
    return found


def _check_template(spec: FineTuneJobSpec, bad: Callable[[str, str], None]) -> None:
    """The template rules that need no configuration (labels and tolerations as the CRD says them)."""
    template = spec.template
    if any(
        k.startswith(constants.RESERVED_LABEL_PREFIXES) or k in constants.RESERVED_LABEL_KEYS for k in template.labels
    ):
        bad("spec.template.labels", RESERVED_LABELS_MESSAGE)
    for i, toleration in enumerate(template.tolerations):
        if not toleration.key and toleration.operator == "Exists":
            bad(f"spec.template.tolerations[{i}]", TOLERATE_EVERYTHING_MESSAGE)
    declared = declared_secret_refs(spec)
    for i, env in enumerate(template.env):
        name = env.get("name")
        if not isinstance(name, str) or not name:
            bad(f"spec.template.env[{i}].name", "is required")
        elif name in constants.RESERVED_ENV_NAMES:
            bad(
                f"spec.template.env[{i}].name",
                f"{name!r} is set by the operator; reserved names: {', '.join(sorted(constants.RESERVED_ENV_NAMES))}",
            )
        value_from = env.get("valueFrom")
        ref = value_from.get("secretKeyRef") if isinstance(value_from, dict) else None
        if isinstance(ref, dict):
            wanted = (ref.get("name"), ref.get("key"))
            if wanted not in declared:
                own = ", ".join(f"{path}: {n}/{k}" for (n, k), path in declared.items()) or "none"
                bad(
                    f"spec.template.env[{i}].valueFrom.secretKeyRef",
                    f"Secret {wanted[0]!r} key {wanted[1]!r} is not one of the job's own secret references "
                    f"({own}); a pod reads only the Secret keys its spec names",
                )


def check_job(job: FineTuneJob, policy: PodPolicy | None = None) -> list[FieldError]:
    """Every rule a parsed job breaks, the pod policy's included (default: `PodPolicy()`); empty when it can run."""
    spec = job.spec
    ds = spec.distributed.deepspeed
    errors: list[FieldError] = []

    def bad(path: str, message: str) -> None:
        errors.append(FieldError(path, message))

    if len(job.name) > constants.JOB_NAME_MAX:
        bad(
            "metadata.name",
            f"must be at most {constants.JOB_NAME_MAX} characters so child names stay DNS labels",
        )
    stage = ds.zero_stage
    if ds.offload_params != "none" and stage not in (3, "auto"):
        bad(
            f"{DS}.offloadParams",
            f"{ds.offload_params!r} needs zeroStage 3 (got {stage}); set zeroStage: 3 or offloadParams: none",
        )
    if ds.offload_optimizer != "none" and stage == 0:
        bad(
            f"{DS}.offloadOptimizer",
            f"{ds.offload_optimizer!r} needs zeroStage >= 1 (got 0); set zeroStage: 1, 2 or 3, "
            "or offloadOptimizer: none",
        )
    if "nvme" in (ds.offload_params, ds.offload_optimizer) and not ds.nvme_path:
        bad(f"{DS}.nvmePath", "is required with nvme offload; set it to a local NVMe mount")
    for path, owner in OWNED_OVERRIDES.items():
        if _lookup(ds.overrides, path):
            bad(f"{DS}.overrides.{'.'.join(path)}", f"is set by the spec; use {owner} instead")
    if spec.model.quantization is not None and spec.adapter.type != "lora":
        bad("spec.model.quantization", "QLoRA needs a LoRA adapter (spec.adapter.type: lora)")
    dist = spec.distributed
    if dist.gpus_per_node == 0 and dist.processes_per_node is None:
        bad("spec.distributed.processesPerNode", "must be set when gpusPerNode is 0 (CPU-only job)")
    if dist.gpus_per_node == 0 and spec.model.quantization is not None:
        bad("spec.model.quantization", "bitsandbytes 4-bit needs GPUs; set distributed.gpusPerNode > 0")
    if dist.gpus_per_node and dist.processes_per_node and dist.processes_per_node > dist.gpus_per_node:
        bad(
            "spec.distributed.processesPerNode",
            f"{dist.processes_per_node} processes cannot share {dist.gpus_per_node} GPUs; use at most gpusPerNode",
        )
    training = spec.training
    if training.save_strategy == "steps" and training.save_steps is None:
        bad("spec.training.saveSteps", "is required with saveStrategy: steps")
    if training.offload_activations and not training.gradient_checkpointing:
        bad("spec.training.offloadActivations", "needs gradientCheckpointing: true (only checkpoints are offloaded)")
    if training.eval_strategy == "steps" and training.eval_steps is None:
        bad("spec.training.evalSteps", "is required with evalStrategy: steps")
    if training.eval_strategy != "no" and len(spec.dataset.splits) < 2:
        bad(
            "spec.dataset.splits",
            f"evalStrategy {training.eval_strategy!r} needs an eval split (got {spec.dataset.splits}); "
            "add one or set training.evalStrategy: no",
        )
    if training.mixed_precision == "fp16" and dist.gpus_per_node == 0:
        bad("spec.training.mixedPrecision", "fp16 is not supported on CPU; use bf16 or no")
    if training.merge_adapter and spec.model.quantization is not None:
        bad(
            "spec.training.mergeAdapter",
            "cannot merge into a 4-bit base model; unset it or drop quantization",
        )
    volume = spec.output.checkpoints
    if (volume.persistent_volume_claim is None) == (volume.empty_dir is None):
        bad("spec.output.checkpoints", "set exactly one of persistentVolumeClaim or emptyDir")
    elif volume.persistent_volume_claim is not None and not volume.persistent_volume_claim.get("claimName"):
        bad("spec.output.checkpoints.persistentVolumeClaim.claimName", "is required")
    _check_template(spec, bad)
    if isinstance(spec.adapter.target_modules, list) and not spec.adapter.target_modules:
        bad("spec.adapter.targetModules", "must name at least one module, or be 'all-linear'")
    return errors + check_pod_policy(job, policy or PodPolicy())
