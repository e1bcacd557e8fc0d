"""Checks of a report that depend on the job: where its output may point.

The model (`finetune_api.v1alpha1.status`) already bounds every number and string. What it cannot know
is the job's spec: an output is only for a job with `spec.output.hub`, its `hubRepo` must be that
`repoId`, and its `url` must be on that Hub. For an `https://` endpoint (the default is
https://huggingface.co) that means an https URL on the same host and port, without user info; for an
`http://` endpoint (a test Hub inside the cluster) the URL must start with exactly that endpoint and
a slash. So a report cannot put a `javascript:` link, another site or another repo into status.
"""

from urllib.parse import urlsplit

from finetune_api.v1alpha1.status import OutputStatus
from finetune_operator.progress.directory import JobFacts
from finetune_operator.progress.reasons import Reason


def on_hub(url: str, endpoint: str) -> bool:
    """Whether `url` points at the Hub `endpoint` (see the module docstring for the rule)."""
    try:
        hub, link = urlsplit(endpoint), urlsplit(url)
        if hub.scheme == "http":
            return url.startswith(endpoint.rstrip("/") + "/")
        return (
            hub.scheme == "https"
            and link.scheme == "https"
            and link.username is None
            and link.password is None
            and link.hostname is not None
            and link.hostname == hub.hostname
            and link.port == hub.port
        )
    except ValueError:  # a port that is not a number, a bad IPv6 literal
        return False


def output_refusal(output: OutputStatus, facts: JobFacts) -> Reason | None:
    """Why this job may not report this output, or None."""
    if facts.hub_endpoint is None:
        return "output_without_hub"
    if output.hub_repo is not None and output.hub_repo != facts.hub_repo:
        return "repo_mismatch"
    if output.url is not None and not on_hub(output.url, facts.hub_endpoint):
        return "url_not_on_hub"
    return None
