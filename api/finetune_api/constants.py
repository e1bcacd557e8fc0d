"""Every name the operator, the renderers and the trainer agree on, in one place.

Label keys, mount paths, ports, environment variable names and trainer exit codes live here so
that "where is X set" has one answer, and so the reserved-names set used to inject values is the
same one used to reject user env vars that would collide with them.

Every `FTJOB_*` environment variable the product reads is defined here and nowhere else (a test
fails on an `"FTJOB_` string literal in any other module of the three packages), each with a
docstring saying who reads it and what it does.
"""

from typing import Final

GROUP: Final = "finetune.dev"
VERSION: Final = "v1alpha1"
KIND: Final = "FineTuneJob"
PLURAL: Final = "finetunejobs"
SINGULAR: Final = "finetunejob"
SHORT_NAME: Final = "ftj"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# Labels and annotations on every child.
LABEL_JOB_NAME: Final = f"{GROUP}/job-name"
LABEL_ATTEMPT: Final = f"{GROUP}/attempt"
LABEL_COMPONENT: Final = f"{GROUP}/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
"""Set by the Job controller on each pod of an Indexed Job (label and annotation): the pod's node rank."""
MANAGED_BY: Final = "finetune-operator"
FINALIZER: Final = f"{GROUP}/finalizer"
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"

# Paths inside the trainer pod.
CONFIG_MOUNT: Final = "/etc/ftjob"
ACCELERATE_FILE: Final = "accelerate.yaml"
DEEPSPEED_FILE: Final = "deepspeed.json"
TRAINER_FILE: Final = "trainer.json"
CHECKPOINT_MOUNT: Final = "/checkpoints"
ADAPTER_SUBDIR: Final = "adapter"
SHM_MOUNT: Final = "/dev/shm"
PROGRESS_TOKEN_MOUNT: Final = "/var/run/secrets/finetune.dev/progress"
PROGRESS_TOKEN_FILE: Final = "token"
PROGRESS_CA_FILE: Final = "progress-ca.crt"  # in the job's ConfigMap when the operator pins its CA

# Environment given to the trainer container (reserved: users may not set these in template.env).
ENV_HF_TOKEN: Final = "HF_TOKEN"
"""The Hub token, from the job's Secret reference (`secretKeyRef`); never written to a file or status."""
ENV_JOB_NAME: Final = "FTJOB_NAME"
"""The FineTuneJob's name, for the model card and the progress report."""
ENV_JOB_NAMESPACE: Final = "FTJOB_NAMESPACE"
"""The FineTuneJob's namespace."""
ENV_ATTEMPT: Final = "FTJOB_ATTEMPT"
"""The attempt (1-based) this pod belongs to; the progress endpoint ignores reports from older attempts."""
ENV_PROGRESS_URL: Final = "FTJOB_PROGRESS_URL"
"""The operator's progress endpoint (`https://.../progress/<ns>/<job>`); unset: the trainer reports nothing."""
ENV_PROGRESS_TOKEN_FILE: Final = "FTJOB_PROGRESS_TOKEN_FILE"
"""The projected ServiceAccount token the trainer presents; re-read on every POST (it rotates)."""
ENV_PROGRESS_CA_FILE: Final = "FTJOB_PROGRESS_CA_FILE"
"""The CA bundle that verifies the progress endpoint; unset: the system trust store."""
ENV_COMPLETION_INDEX: Final = "JOB_COMPLETION_INDEX"
RESERVED_ENV_NAMES: Final = frozenset(
    {
        ENV_HF_TOKEN,
        ENV_JOB_NAME,
        ENV_JOB_NAMESPACE,
        ENV_ATTEMPT,
        ENV_PROGRESS_URL,
        ENV_PROGRESS_TOKEN_FILE,
        ENV_PROGRESS_CA_FILE,
        ENV_COMPLETION_INDEX,
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "NODE_RANK",
    }
)

# Label keys `spec.template.labels` may not set: the operator's own (it selects and indexes its children by
# them) and the ones the Job controller puts on every pod of a Job.
RESERVED_LABEL_PREFIXES: Final = (f"{GROUP}/", "batch.kubernetes.io/")
RESERVED_LABEL_KEYS: Final = (LABEL_MANAGED_BY, "controller-uid", "job-name")

# The trainer pod's identity and writable paths. The trainer image (Dockerfile, target `trainer`) runs as this
# uid/gid with HOME below, every cache under HOME's .cache; the pod runs it with a read-only root filesystem
# and disk-backed emptyDirs at these two paths (Pod Security `restricted`).
TRAINER_UID: Final = 65532
TRAINER_HOME: Final = "/home/ftjob"
TRAINER_CACHE_MOUNT: Final = f"{TRAINER_HOME}/.cache"
TMP_MOUNT: Final = "/tmp"
TERMINATION_GRACE_SECONDS: Final = 300
"""The trainer pod's grace period: time to write a checkpoint on SIGTERM (the operator waits this long, and a
minute more, for a failed attempt's pods before it calls the attempt stuck)."""

# Resources.
GPU_RESOURCE: Final = "nvidia.com/gpu"
TRAINER_CONTAINER: Final = "trainer"
DEFAULT_TRAINER_IMAGE: Final = "ghcr.io/finetune-operator/trainer:0.1.0"

# Kubernetes limits that bound child names.
DNS_LABEL_MAX: Final = 63
# Longest suffix a child adds to the job name: "-" + attempt (up to 3 digits) + "-" + index (up to 3 digits).
MAX_ATTEMPT_DIGITS: Final = 3
MAX_INDEX_DIGITS: Final = 3
JOB_NAME_MAX: Final = DNS_LABEL_MAX - (1 + MAX_ATTEMPT_DIGITS) - (1 + MAX_INDEX_DIGITS)

# Trainer exit codes. Anything not listed here is retryable.
EXIT_OK: Final = 0
EXIT_INVALID_CONFIG: Final = 64  # EX_USAGE: trainer.json does not validate
EXIT_BAD_DATASET: Final = 65  # EX_DATAERR: missing text field, empty split, unreadable file
EXIT_UNKNOWN_MODEL: Final = 66  # EX_NOINPUT: model id or path that does not exist
EXIT_PERMANENT_CODES: Final = frozenset({EXIT_INVALID_CONFIG, EXIT_BAD_DATASET, EXIT_UNKNOWN_MODEL})
EXIT_SIGTERM: Final = 143  # 128 + SIGTERM: stopped after saving a checkpoint; retryable, the next attempt resumes


# Knobs read from the environment by the trainer and the CLI (not injected by the operator).
ENV_CACHE: Final = "FTJOB_CACHE"
"""Cache root for built-in tiny models, datasets and tokenizers (default `~/.cache/finetune-operator`)."""
ENV_SPEED: Final = "FTJOB_SPEED"
"""Overrides the speed levers the trainer picks itself: `none`, or a comma list such as `varlen,liger`."""
ENV_ZERO3_4BIT_LOAD: Final = "FTJOB_ZERO3_4BIT_LOAD"
"""QLoRA + ZeRO-3 load: `partitioned` (default: each 4-bit weight is partitioned as it is quantized) or `whole`."""
ENV_EXIT_FILE: Final = "FTJOB_EXIT_FILE"
"""Set by `finetune_trainer.launch` for its workers: where a failing worker writes its termination record."""
ENV_TERMINATION_LOG: Final = "FTJOB_TERMINATION_LOG"
"""Where the launcher writes the container's termination message (default `/dev/termination-log`); for tests."""
ENV_TEST_FAULT: Final = "FTJOB_TEST_FAULT"
"""Test hook, never set in production: the trainer fails on purpose right after loading the model. `exit:65`
raises the permanent error with that code; `crash-once:PATH` makes the first worker to create PATH SIGKILL itself
(later runs find PATH and go on), a transient failure that torch elastic restarts."""
ENV_LOG_LEVEL: Final = "FTJOB_LOG_LEVEL"
"""The trainer's console output (`finetune_trainer.output`): `info` (default: third-party warnings once each, ranks
other than 0 errors only), `debug` (everything, every time, every rank; `ftjob run --verbose` sets it), `warning`
or `error` (quieter)."""
ENV_LOG_FORMAT: Final = "FTJOB_LOG_FORMAT"
"""`text` (default) or `json`: the trainer writes one JSON object per log line, for log collectors. Not set by the
operator: a job's pods get it from `spec.template.env`."""
