"""Every way a progress push can end: a short reason code, its HTTP status and the text the caller sees.

One table, so the `reason` label of `finetune_progress_rejected_total` has a fixed set of values (a
bounded label, whatever a caller sends) and every refusal answers the same status everywhere. The
texts are safe to return: they never echo the token, the body or a Kubernetes object.
"""

from typing import Final, Literal

Reason = Literal[
    "no_token",
    "malformed_token",
    "wrong_audience",
    "expired_token",
    "other_namespace",
    "not_pod_bound",
    "unknown_job",
    "refused_recently",
    "source_rate",
    "global_rate",
    "review_busy",
    "review_unavailable",
    "review_refused",
    "not_service_account",
    "pod_missing",
    "pod_replaced",
    "not_attempt_pod",
    "not_current_attempt",
    "job_rate",
    "too_large",
    "body_timeout",
    "invalid_report",
    "output_without_hub",
    "url_not_on_hub",
    "repo_mismatch",
    "job_gone",
    "status_write_failed",
    "internal",
]

ANSWERS: Final[dict[Reason, tuple[int, str]]] = {
    "no_token": (401, "missing bearer token"),
    "malformed_token": (401, "the bearer token is not a ServiceAccount token"),
    "wrong_audience": (401, "token not valid for this job's audience"),
    "expired_token": (401, "the bearer token has expired"),
    "other_namespace": (403, "token is not a ServiceAccount token of this namespace"),
    "not_pod_bound": (403, "token is not bound to a pod"),
    "unknown_job": (401, "token not valid for this job"),
    "refused_recently": (401, "this token was refused recently"),
    "source_rate": (429, "too many unauthenticated requests from this address"),
    "global_rate": (429, "too many unauthenticated requests; retry later"),
    "review_busy": (503, "too many token reviews in flight; retry later"),
    "review_unavailable": (503, "could not review the token now; retry later"),
    "review_refused": (401, "token not valid for this job's audience"),
    "not_service_account": (403, "token is not a ServiceAccount token of this namespace"),
    "pod_missing": (403, "the token's pod does not exist"),
    "pod_replaced": (403, "the token's pod was replaced"),
    "not_attempt_pod": (403, "the token's pod does not belong to this job's attempt"),
    "not_current_attempt": (403, "the token's pod belongs to an attempt that is not current"),
    "job_rate": (429, "too many reports; at most one per second"),
    "too_large": (413, "body over the size limit"),
    "body_timeout": (408, "the body did not arrive in time"),
    "invalid_report": (400, "not a valid TrainerReport"),
    "output_without_hub": (422, "this job has no output.hub to report"),
    "url_not_on_hub": (422, "output.url is not on this job's Hub endpoint"),
    "repo_mismatch": (422, "output.hubRepo is not this job's output.hub.repoId"),
    "job_gone": (404, "no such FineTuneJob"),
    "status_write_failed": (503, "could not write status now; retry later"),
    "internal": (500, "internal error"),
}

QUIET: Final[frozenset[Reason]] = frozenset(
    {
        "no_token",
        "malformed_token",
        "wrong_audience",
        "expired_token",
        "other_namespace",
        "not_pod_bound",
        "unknown_job",
        "refused_recently",
        "source_rate",
        "global_rate",
        "review_busy",
        "job_rate",
    }
)
"""Refusals that cost nothing and may come by the thousand in a flood: counted, but logged at debug only
(an INFO line each would let a flood fill the operator's log)."""

RESULTS: Final[dict[int, str]] = {
    200: "accepted",
    400: "invalid",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    408: "timeout",
    413: "too_large",
    422: "invalid",
    429: "rate_limited",
    500: "error",
    503: "unavailable",
}
"""The coarse `result` label of `finetune_progress_pushes_total`, by HTTP status."""
