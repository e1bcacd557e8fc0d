"""The Kubernetes children of a job: ConfigMap, headless Service, and one Indexed Job per attempt.

Plain dicts, no client objects: the handlers add owner references and apply them. Every child has
the job-name label; the Job and its pods also carry the attempt label.

The trainer pod passes Pod Security `restricted` as rendered: it runs as the trainer image's non-root
uid, without privilege escalation or capabilities, under the runtime's default seccomp profile, with a
read-only root filesystem and disk-backed emptyDirs where the trainer writes (/tmp, and HOME's .cache,
which holds the Hub cache, DeepSpeed's built ops and the Triton and CUDA caches; Dockerfile, target
`trainer`). `spec.template.securityContext` is merged over the container's key by key, as far as the
operator's pod policy allows (`finetune_operator.policy`, checked before rendering).
"""

import copy
from typing import Any

from finetune_api import constants
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render import names
from finetune_operator.render.command import render_node_command
from finetune_operator.render.context import RenderContext
from finetune_operator.render.files import render_config_files
from finetune_operator.render.topology import compute_topology

PROGRESS_TOKEN_TTL_SECONDS = 3600
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": constants.TRAINER_UID,
    "runAsGroup": constants.TRAINER_UID,
    # The checkpoint PVC's files become the trainer's group; only when its root differs (large volumes).
    "fsGroup": constants.TRAINER_UID,
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
WRITABLE_DIRS = {"tmp": constants.TMP_MOUNT, "cache": constants.TRAINER_CACHE_MOUNT}
"""emptyDir volume name -> mount path: where the trainer writes besides checkpoints and /dev/shm."""


def render_config_map(ctx: RenderContext) -> dict[str, Any]:
    """The rendered files (`render_config_files`), byte for byte what `ftjob render` writes."""
    job = ctx.job
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.config_map_name(job),
            "namespace": job.namespace,
            "labels": names.job_labels(job),
        },
        "data": dict(sorted(render_config_files(ctx).items())),
    }


def render_service(ctx: RenderContext) -> dict[str, Any]:
    """Headless Service so node 0 has a DNS name before it is ready (rendezvous happens before ready)."""
    job = ctx.job
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service_name(job),
            "namespace": job.namespace,
            "labels": names.job_labels(job),
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {constants.LABEL_JOB_NAME: job.name},
            "ports": [{"name": "rendezvous", "port": job.spec.distributed.rendezvous.port}],
        },
    }


def _hf_token_env(job: FineTuneJob) -> list[dict[str, Any]]:
    """HF_TOKEN from the Secret the spec names: the push token, else the model-download token."""
    hub = job.spec.output.hub
    ref = hub.token_secret_ref if hub else job.spec.model.token_secret_ref
    if ref is None:
        return []
    return [
        {"name": constants.ENV_HF_TOKEN, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
    ]


def _checkpoint_volume(job: FineTuneJob) -> dict[str, Any]:
    volume = job.spec.output.checkpoints
    if volume.persistent_volume_claim is not None:
        return {"name": "checkpoints", "persistentVolumeClaim": dict(volume.persistent_volume_claim)}
    return {"name": "checkpoints", "emptyDir": dict(volume.empty_dir or {})}


def _resources(job: FineTuneJob) -> dict[str, Any]:
    resources = {k: dict(v) for k, v in job.spec.template.resources.items() if isinstance(v, dict)}
    gpus = job.spec.distributed.gpus_per_node
    if gpus:
        for kind in ("limits", "requests"):
            resources.setdefault(kind, {})[constants.GPU_RESOURCE] = gpus
    return resources


def render_pod_template(ctx: RenderContext) -> dict[str, Any]:
    """The trainer pod of one attempt."""
    job, attempt, options = ctx.job, ctx.attempt, ctx.options
    progress_url, progress_ca_file = options.progress_url, options.progress_ca_file
    template = job.spec.template
    env: list[dict[str, Any]] = [
        {"name": constants.ENV_JOB_NAME, "value": job.name},
        {"name": constants.ENV_JOB_NAMESPACE, "value": job.namespace},
        {"name": constants.ENV_ATTEMPT, "value": str(attempt)},
        *_hf_token_env(job),
    ]
    mounts = [
        {"name": "config", "mountPath": constants.CONFIG_MOUNT, "readOnly": True},
        {"name": "checkpoints", "mountPath": constants.CHECKPOINT_MOUNT},
        {"name": "dshm", "mountPath": constants.SHM_MOUNT},
        *({"name": name, "mountPath": path} for name, path in WRITABLE_DIRS.items()),
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.config_map_name(job)}},
        _checkpoint_volume(job),
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": template.shm_size}},
        *({"name": name, "emptyDir": {}} for name in WRITABLE_DIRS),
    ]
    if progress_url:
        token_path = f"{constants.PROGRESS_TOKEN_MOUNT}/{constants.PROGRESS_TOKEN_FILE}"
        env += [
            {"name": constants.ENV_PROGRESS_URL, "value": progress_url},
            {"name": constants.ENV_PROGRESS_TOKEN_FILE, "value": token_path},
        ]
        if progress_ca_file:
            env.append({"name": constants.ENV_PROGRESS_CA_FILE, "value": progress_ca_file})
        mounts.append(
            {"name": "progress-token", "mountPath": constants.PROGRESS_TOKEN_MOUNT, "readOnly": True}
        )
        volumes.append(
            {
                "name": "progress-token",
                "projected": {
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": names.progress_audience(job),
                                "expirationSeconds": PROGRESS_TOKEN_TTL_SECONDS,
                                "path": constants.PROGRESS_TOKEN_FILE,
                            }
                        }
                    ]
                },
            }
        )
    env += [dict(e) for e in template.env]
    container: dict[str, Any] = {
        "name": constants.TRAINER_CONTAINER,
        "image": template.image or options.image,
        "command": render_node_command(ctx),
        "env": env,
        "volumeMounts": mounts,
        "resources": _resources(job),
        "ports": [{"name": "rendezvous", "containerPort": job.spec.distributed.rendezvous.port}],
        "securityContext": copy.deepcopy({**CONTAINER_SECURITY_CONTEXT, **(template.security_context or {})}),
    }
    if template.image_pull_policy:
        container["imagePullPolicy"] = template.image_pull_policy
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": names.service_name(job),
        "terminationGracePeriodSeconds": constants.TERMINATION_GRACE_SECONDS,
        "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
        "containers": [container],
        "volumes": volumes,
    }
    optional = {
        "nodeSelector": dict(template.node_selector) or None,
        "tolerations": [t.to_dict(exclude_none=True) for t in template.tolerations] or None,
        "affinity": template.affinity,
        "priorityClassName": template.priority_class_name,
        "serviceAccountName": template.service_account_name,
    }
    pod_spec |= {key: value for key, value in optional.items() if value}
    return {
        "metadata": {
            "labels": {**template.labels, **names.attempt_labels(job, attempt)},
            "annotations": dict(template.annotations),
        },
        "spec": pod_spec,
    }


def render_job(ctx: RenderContext) -> dict[str, Any]:
    """The Indexed Job of one attempt: one pod per node; any pod failure fails the attempt.

    `backoffLimit: 0` because a restarted single pod cannot rejoin a torch rendezvous on its own:
    the operator restarts the whole gang as the next attempt. The pod-failure policy fails the Job
    at once (reason `PodFailurePolicy`) on the trainer's permanent exit codes, which are the container's
    own because the pod runs the launcher (`render/command.py`); the pod's termination message says why.
    """
    job, attempt, topology = ctx.job, ctx.attempt, compute_topology(ctx)
    labels = names.attempt_labels(job, attempt)
    queue = job.metadata.labels.get(constants.KUEUE_QUEUE_LABEL)
    if queue:
        labels[constants.KUEUE_QUEUE_LABEL] = queue
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": names.attempt_job_name(job, attempt),
            "namespace": job.namespace,
            "labels": labels,
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": topology.num_machines,
            "parallelism": topology.num_machines,
            "backoffLimit": 0,
            "suspend": job.spec.run_policy.suspend or bool(queue),
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": constants.TRAINER_CONTAINER,
                            "operator": "In",
                            "values": sorted(constants.EXIT_PERMANENT_CODES),
                        },
                    }
                ]
            },
            "template": render_pod_template(ctx),
        },
    }
