"""Every rule a parsed FineTuneJob breaks, collected at once, with field paths: `check_job`.

`ftjob render`, `ftjob run` and the operator call it, so the three accept and reject the same jobs with the
same words. The rules come from four places, kept apart because they differ in who else checks them:

1. The API objects' rule tables (`finetune_api.v1alpha1.rules`): the rules the CRD's CEL states at `kubectl
   apply`, here run in Python from the same table entries, with the API server's path and message. A job
   that breaks one can still reach the operator: stored under an older CRD, or never applied (`ftjob render`).
2. `free_form_errors`: rules inside fields the CRD keeps free-form or untyped (DeepSpeed overrides, env
   entries, the PVC source, targetModules), which CEL cannot read.
3. `trainer_errors`: rules the CRD does not state, though CEL could: what the trainer can run (a CPU has no
   bitsandbytes 4-bit nor fp16; a 4-bit model cannot be merged; an eval strategy needs an eval split and
   step numbers). The API server accepts such a job and the operator fails it with reason InvalidSpec;
   moving one into its object's table would make `kubectl apply` refuse it.
4. The operator's pod policy (`finetune_operator.policy`), which depends on the operator's flags.

The memory planner's rules (`zeroStage: auto` must fit) are admission's (`finetune_operator.admit`), after these.
Pure: no I/O, no Kubernetes.
"""

from collections.abc import Callable

from pydantic import BaseModel

from finetune_api import constants
from finetune_api.v1alpha1.errors import FieldError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.rules import violations
from finetune_api.v1alpha1.spec import FineTuneJobSpec, SecretKeyRef
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

Report = Callable[[str, str], None]


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


def _env_errors(spec: FineTuneJobSpec, bad: Report) -> None:
    """`spec.template.env`: a name the operator does not set, and a secretKeyRef only to a Secret key the spec
    names elsewhere (a pod reads only what its author declared)."""
    declared = declared_secret_refs(spec)
    for i, env in enumerate(spec.template.env):
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


def free_form_errors(spec: FineTuneJobSpec, bad: Report) -> None:
    """Rules inside fields the CRD keeps free-form (`x-kubernetes-preserve-unknown-fields`), where CEL sees no
    keys: DeepSpeed overrides of keys the spec owns, env entries, the PVC source, and targetModules (a string
    or a list, which has no structural schema)."""
    for path, owner in OWNED_OVERRIDES.items():
        if _lookup(spec.distributed.deepspeed.overrides, path):
            bad(f"{DS}.overrides.{'.'.join(path)}", f"is set by the spec; use {owner} instead")
    volume = spec.output.checkpoints
    if (volume.persistent_volume_claim is None) == (volume.empty_dir is None):
        bad("spec.output.checkpoints", "set exactly one of persistentVolumeClaim or emptyDir")
    elif volume.persistent_volume_claim is not None and not volume.persistent_volume_claim.get("claimName"):
        bad("spec.output.checkpoints.persistentVolumeClaim.claimName", "is required")
    _env_errors(spec, bad)
    if isinstance(spec.adapter.target_modules, list) and not spec.adapter.target_modules:
        bad("spec.adapter.targetModules", "must name at least one module, or be 'all-linear'")


def trainer_errors(spec: FineTuneJobSpec, bad: Report) -> None:
    """Rules the CRD does not state: what the trainer can run (see the module docstring)."""
    dist = spec.distributed
    if dist.gpus_per_node == 0 and spec.model.quantization is not None:
        bad("spec.model.quantization", "bitsandbytes 4-bit needs GPUs; set distributed.gpusPerNode > 0")
    if dist.gpus_per_node and dist.processes_per_node and dist.processes_per_node > dist.gpus_per_node:
        bad(
            "spec.distributed.processesPerNode",
            f"{dist.processes_per_node} processes cannot share {dist.gpus_per_node} GPUs; use at most gpusPerNode",
        )
    training = spec.training
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


def check_job(job: FineTuneJob, policy: PodPolicy | None = None) -> list[FieldError]:
    """Every rule a parsed job breaks, the pod policy's included (default: `PodPolicy()`); empty when it can run.
    In the module docstring's order: the rule tables, free-form fields, the trainer's limits, the pod policy."""
    errors = violations(job)

    def bad(path: str, message: str) -> None:
        errors.append(FieldError(path, message))

    free_form_errors(job.spec, bad)
    trainer_errors(job.spec, bad)
    return errors + check_pod_policy(job, policy or PodPolicy())
