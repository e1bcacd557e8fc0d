"""Prometheus metrics of the operator, served on `/metrics` (names follow Kubeflow's training operator).

Holds the metric objects only; handlers and the progress endpoint increment them. Labels are
bounded (namespace, reason, result), never a job name, so cardinality stays flat at scale.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

JOBS_CREATED = Counter(
    "finetune_jobs_created_total", "FineTuneJobs whose first attempt was created.", ["namespace"], registry=REGISTRY
)
JOBS_SUCCEEDED = Counter(
    "finetune_jobs_succeeded_total", "FineTuneJobs that reached Succeeded.", ["namespace"], registry=REGISTRY
)
JOBS_FAILED = Counter(
    "finetune_jobs_failed_total", "FineTuneJobs that reached Failed, by reason.", ["namespace", "reason"],
    registry=REGISTRY,
)
JOBS_RESTARTED = Counter(
    "finetune_jobs_restarted_total", "Attempts restarted after a failure, by reason.", ["namespace", "reason"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "finetune_reconcile_duration_seconds",
    "Time to reconcile one FineTuneJob (read, decide, apply, write status).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
PROGRESS_PUSHES = Counter(
    "finetune_progress_pushes_total", "Progress reports received, by result.", ["result"], registry=REGISTRY
)
PROGRESS_REJECTED = Counter(
    "finetune_progress_rejected_total",
    "Progress reports refused, by reason (a fixed set: progress.reasons.Reason).",
    ["reason"],
    registry=REGISTRY,
)
PROGRESS_TOKEN_REVIEWS = Counter(
    "finetune_progress_token_reviews_total",
    "TokenReviews the progress endpoint made, by result (authenticated, refused, error).",
    ["result"],
    registry=REGISTRY,
)
PROGRESS_CONNECTIONS = Gauge(
    "finetune_progress_connections", "Open connections to the progress endpoint (from TCP accept).", registry=REGISTRY
)
PROGRESS_CONNECTIONS_REFUSED = Counter(
    "finetune_progress_connections_refused_total",
    "Connections closed at once because the endpoint (or that client address) had too many open.",
    registry=REGISTRY,
)
