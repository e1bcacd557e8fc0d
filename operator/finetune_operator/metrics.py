"""Prometheus metrics of the operator, served on `/metrics` (names follow Kubeflow's training operator).

Holds the metric objects; handlers and the progress endpoint update them. The operator-wide series are
labelled only by bounded sets (namespace, reason, result), so their cardinality stays flat at scale.

The per-job gauges (`finetune_job_*`: loss, eval loss, tokens per second, progress ratio, ETA, attempt)
are the exception: they carry the job's namespace and name. `JOB_SERIES.record` sets them from an
accepted progress report only; `JOB_SERIES.job_event` (the FineTuneJob watch handler) removes them when
the job is deleted, finishes (Succeeded, Failed) or is suspended, and the progress endpoint removes them
when its status write finds the job gone or already finished. So they describe the jobs training now,
the way a kube-state-metrics series lives as long as its object; a finished job's curves stay in
Prometheus' history, and its last tokens per second does not go on counting in
`sum(finetune_job_tokens_per_second)`. Kubeflow's training operator exports only operator-wide counters
(no per-job series); KubeRay keeps its per-resource state gauges until the resource is deleted. These
gauges go earlier, at the end of training, because they are rates and estimates of training in progress
(a finished job's tokens per second and ETA are no longer true); neither project leaves a series behind
for every job that ever ran, and neither does this one.

Where a replica never sees the end of a job (one on standby under kopf peering still serves the reports
the Service sends it, but has no watch; a DELETED event missed across a watch restart), the series that
no report has refreshed for `JOB_SERIES_TTL_SECONDS` are dropped before each scrape (`JOB_SERIES.expire`).
Bound, per replica: 6 x (jobs training now + jobs that ended within the last `JOB_SERIES_TTL_SECONDS`
unseen by this replica), i.e. the live jobs, not every job that ever ran. Because a trainer's reports land
on any replica, each replica exports the jobs it heard from; the dashboard
(charts/finetune-operator/dashboards) takes `max by (namespace, job)`.
"""

import contextlib
import math
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from finetune_api.v1alpha1.status import TERMINAL_PHASES

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

NOT_TRAINING_PHASES: frozenset[str] = TERMINAL_PHASES | {"Suspended"}
"""Phases in which a job's per-job series are removed: it trains no more (or not until resumed)."""
JOB_LABELS = ["namespace", "job"]
JOB_LOSS = Gauge("finetune_job_loss", "Latest training loss a job reported.", JOB_LABELS, registry=REGISTRY)
JOB_EVAL_LOSS = Gauge("finetune_job_eval_loss", "Latest eval loss a job reported.", JOB_LABELS, registry=REGISTRY)
JOB_TOKENS_PER_SECOND = Gauge(
    "finetune_job_tokens_per_second", "Training tokens per second of a job (all its GPUs).", JOB_LABELS,
    registry=REGISTRY,
)
JOB_PROGRESS_RATIO = Gauge(
    "finetune_job_progress_ratio", "Fraction of a job's planned optimizer steps done (0 to 1).", JOB_LABELS,
    registry=REGISTRY,
)
JOB_ETA_SECONDS = Gauge(
    "finetune_job_eta_seconds", "Seconds a job estimates it has left.", JOB_LABELS, registry=REGISTRY
)
JOB_ATTEMPT = Gauge(
    "finetune_job_attempt", "Attempt of a job that sent its latest accepted report (1-based).", JOB_LABELS,
    registry=REGISTRY,
)
JOB_GAUGES: tuple[Gauge, ...] = (
    JOB_LOSS, JOB_EVAL_LOSS, JOB_TOKENS_PER_SECOND, JOB_PROGRESS_RATIO, JOB_ETA_SECONDS, JOB_ATTEMPT
)
JOB_SERIES_TTL_SECONDS = 3600.0
"""A job's series that no accepted report refreshed for this long are dropped (see the module docstring). An
hour: far longer than any gap between a trainer's reports (every logging step, at most every few seconds)
short of an evaluation or checkpoint upload that long, after which the next report brings them back."""


class JobSeries:
    """Which jobs have per-job series, and when a report last refreshed each: what `forget` and `expire` use.

    The gauges are written from the progress endpoint and removed from the watch handlers, both on the
    event loop; a lock keeps a scrape's expiry (aiohttp handler, same loop) and any other thread safe anyway.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._refreshed: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def record(
        self,
        namespace: str,
        job: str,
        *,
        attempt: int,
        loss: float | None = None,
        eval_loss: float | None = None,
        tokens_per_second: float | None = None,
        progress_ratio: float | None = None,
        eta_seconds: float | None = None,
    ) -> None:
        """Set the job's gauges from one accepted report. A value the report leaves out keeps the previous one
        (the status patch merges the same way), except the attempt, which every report carries."""
        values = {
            JOB_LOSS: loss, JOB_EVAL_LOSS: eval_loss, JOB_TOKENS_PER_SECOND: tokens_per_second,
            JOB_PROGRESS_RATIO: progress_ratio, JOB_ETA_SECONDS: eta_seconds, JOB_ATTEMPT: float(attempt),
        }
        with self._lock:
            for gauge, value in values.items():
                if value is not None and math.isfinite(value):
                    gauge.labels(namespace, job).set(value)
            self._refreshed[(namespace, job)] = self.clock()

    def forget(self, namespace: str, job: str) -> None:
        """Remove every series of the job (deleted, finished, suspended); nothing when it has none."""
        with self._lock:
            self._remove(namespace, job)

    def job_event(self, namespace: str, job: str, *, deleted: bool, phase: object) -> None:
        """A watch event of the job: its series go when it is deleted or in a phase of `NOT_TRAINING_PHASES`."""
        if deleted or phase in NOT_TRAINING_PHASES:
            self.forget(namespace, job)

    def expire(self) -> int:
        """Drop the series of jobs no report refreshed for `JOB_SERIES_TTL_SECONDS`; how many jobs went."""
        with self._lock:
            cutoff = self.clock() - JOB_SERIES_TTL_SECONDS
            stale = [key for key, when in self._refreshed.items() if when < cutoff]
            for namespace, job in stale:
                self._remove(namespace, job)
            return len(stale)

    def jobs(self) -> list[tuple[str, str]]:
        """The (namespace, job) pairs that have series now."""
        with self._lock:
            return sorted(self._refreshed)

    def _remove(self, namespace: str, job: str) -> None:
        self._refreshed.pop((namespace, job), None)
        for gauge in JOB_GAUGES:
            with contextlib.suppress(KeyError):  # never set for the job (no eval loss yet): older clients raise
                gauge.remove(namespace, job)


JOB_SERIES = JobSeries()
"""The one table of per-job series of this process."""
