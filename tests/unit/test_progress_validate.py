"""Where a job's reported output may point: its own Hub endpoint's host, its own repo id."""

import pytest

from finetune_api.v1alpha1.status import OutputStatus
from finetune_operator.progress.directory import DEFAULT_HUB_ENDPOINT, JobFacts, job_facts
from finetune_operator.progress.validate import on_hub, output_refusal

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HF = JobFacts("uid", 1, DEFAULT_HUB_ENDPOINT, "acme/demo")
LOCAL = JobFacts("uid", 1, "http://hub.ml.svc:8080", "acme/demo")


@pytest.mark.parametrize(
    ("url", "endpoint", "ok"),
    [
        (f"https://huggingface.co/acme/demo/commit/{COMMIT}", "https://huggingface.co", True),
        ("https://huggingface.co:443/acme/demo", "https://huggingface.co", False),
        ("https://hub.example.com:8443/acme/demo", "https://hub.example.com:8443", True),
        ("https://hub.example.com/acme/demo", "https://hub.example.com:8443", False),
        ("http://huggingface.co/acme/demo", "https://huggingface.co", False),
        ("https://huggingface.co.evil.com/acme/demo", "https://huggingface.co", False),
        ("https://evil.com/huggingface.co/acme/demo", "https://huggingface.co", False),
        ("https://huggingface.co@evil.com/acme/demo", "https://huggingface.co", False),
        ("https://user@huggingface.co/acme/demo", "https://huggingface.co", False),
        ("https://huggingface.co:notaport/x", "https://huggingface.co", False),
        ("https://[::1/x", "https://huggingface.co", False),
        (f"http://hub.ml.svc:8080/acme/demo/commit/{COMMIT}", "http://hub.ml.svc:8080", True),
        ("http://hub.ml.svc:8080.evil.com/acme/demo", "http://hub.ml.svc:8080", False),
        ("http://hub.ml.svc:8081/acme/demo", "http://hub.ml.svc:8080", False),
        ("https://hub.ml.svc:8080/acme/demo", "http://hub.ml.svc:8080", False),
        ("http://hub.ml.svc:8080/acme/demo", "http://hub.ml.svc:8080/", True),
        ("https://huggingface.co/acme/demo", "ftp://huggingface.co", False),
    ],
)
def test_urls_on_the_jobs_hub(url: str, endpoint: str, ok: bool) -> None:
    assert on_hub(url, endpoint) is ok


@pytest.mark.parametrize(
    ("output", "facts", "reason"),
    [
        (OutputStatus(hub_repo="acme/demo", revision=COMMIT, url=f"https://huggingface.co/acme/demo/commit/{COMMIT}"),
         HF, None),
        (OutputStatus(hub_repo="acme/other"), HF, "repo_mismatch"),
        (OutputStatus(url="https://example.com/acme/demo"), HF, "url_not_on_hub"),
        (OutputStatus(url="https://huggingface.co/acme/demo"), LOCAL, "url_not_on_hub"),
        (OutputStatus(url="http://hub.ml.svc:8080/acme/demo"), LOCAL, None),
        (OutputStatus(hub_repo="acme/demo"), JobFacts("uid", 1), "output_without_hub"),
    ],
    ids=["a-real-push", "another-repo", "another-host", "hf-url-for-a-local-hub", "local-hub", "job-without-hub"],
)
def test_output_refusals(output: OutputStatus, facts: JobFacts, reason: str | None) -> None:
    assert output_refusal(output, facts) == reason


def test_job_facts_from_a_body() -> None:
    body = {"metadata": {"uid": "u1"}, "status": {"attempt": 3},
            "spec": {"output": {"hub": {"repoId": "acme/demo", "tokenSecretRef": {"name": "hf", "key": "t"}}}}}
    assert job_facts(body) == JobFacts("u1", 3, DEFAULT_HUB_ENDPOINT, "acme/demo")
    body["spec"]["output"]["hub"]["endpoint"] = "http://hub.ml.svc:8080"  # type: ignore[index]
    assert job_facts(body) == JobFacts("u1", 3, "http://hub.ml.svc:8080", "acme/demo")
    assert job_facts({"metadata": {"uid": "u2"}, "spec": {}}) == JobFacts("u2", 0)
    assert job_facts({"metadata": {"uid": "u3", "deletionTimestamp": "2026-01-01T00:00:00Z"}}) is None
    assert job_facts({"metadata": {}}) is None
    assert job_facts({"metadata": {"uid": "u4"}, "status": {"attempt": "2"}}) == JobFacts("u4", 0)
