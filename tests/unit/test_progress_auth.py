"""Progress auth and rate limit: who may report for which job, and how often (fake TokenReview)."""

import asyncio
from typing import Any

import pytest

from finetune_operator.progress.auth import POD_NAME_EXTRA, POD_UID_EXTRA, Authenticator, audience
from finetune_operator.progress.ratelimit import RateLimiter
from finetune_operator.render.names import progress_audience
from tests.builders import job

PODS = {
    ("ml", "demo-1-0"): ("uid-a", {"finetune.dev/job-name": "demo"}),
    ("ml", "other-1-0"): ("uid-b", {"finetune.dev/job-name": "other"}),
}
# token -> (audience it was issued for, service-account namespace, bound pod, pod uid)
TOKENS = {
    "good": ("finetune.dev/progress/ml/demo", "ml", "demo-1-0", "uid-a"),
    "other-job": ("finetune.dev/progress/ml/other", "ml", "other-1-0", "uid-b"),
    "other-pod-same-aud": ("finetune.dev/progress/ml/demo", "ml", "other-1-0", "uid-b"),
    "unbound": ("finetune.dev/progress/ml/demo", "ml", None, None),
    "stale-pod": ("finetune.dev/progress/ml/demo", "ml", "demo-1-0", "uid-old"),
    "foreign-ns": ("finetune.dev/progress/ml/demo", "elsewhere", "demo-1-0", "uid-a"),
}


class FakeApi:
    def __init__(self) -> None:
        self.reviews = 0

    async def review(self, token: str, aud: str) -> dict[str, Any]:
        self.reviews += 1
        if token not in TOKENS or TOKENS[token][0] != aud:
            return {"authenticated": False, "error": "invalid bearer token"}
        _, ns, pod, uid = TOKENS[token]
        extra = {POD_NAME_EXTRA: [pod], POD_UID_EXTRA: [uid]} if pod else {}
        return {"authenticated": True, "audiences": [aud],
                "user": {"username": f"system:serviceaccount:{ns}:default", "extra": extra}}

    async def pod(self, ns: str, name: str) -> tuple[str, dict[str, str]] | None:
        return PODS.get((ns, name))


CASES = [
    ("the job's own pod-bound token is accepted", "good", 200),
    ("no token is unauthorized", None, 401),
    ("a garbage token is unauthorized", "garbage", 401),
    ("another job's token fails the audience", "other-job", 401),
    ("a token of a pod outside the job is forbidden", "other-pod-same-aud", 403),
    ("a token not bound to a pod is forbidden", "unbound", 403),
    ("a token of a replaced pod is forbidden", "stale-pod", 403),
    ("a ServiceAccount of another namespace is forbidden", "foreign-ns", 403),
]


@pytest.mark.parametrize(("token", "status"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_token_decisions(token: str | None, status: int) -> None:
    api = FakeApi()
    decision = asyncio.run(Authenticator(api.review, api.pod).check("ml", "demo", token))
    assert decision.status == status


def test_accepted_tokens_are_cached_and_refused_ones_are_not() -> None:
    api = FakeApi()
    auth = Authenticator(api.review, api.pod)
    for _ in range(3):
        asyncio.run(auth.check("ml", "demo", "good"))
        asyncio.run(auth.check("ml", "demo", "other-job"))
    assert api.reviews == 1 + 3


def test_the_audience_matches_what_render_puts_in_the_pod() -> None:
    j = job(name="demo", namespace="ml")
    assert audience("ml", "demo") == progress_audience(j)


def test_rate_limit_allows_a_burst_then_one_per_second_per_job() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=1.0, burst=2.0, clock=lambda: now[0])
    assert [limiter.allow(("ml", "a")) for _ in range(3)] == [True, True, False]
    assert limiter.allow(("ml", "b"))
    now[0] = 1.0
    assert [limiter.allow(("ml", "a")) for _ in range(2)] == [True, False]
