"""Progress auth: who may report for which job, what a refusal costs (TokenReviews), and the caches.

The API is a fake (`FakeApi`) that answers TokenReviews, pod and Job reads like the API server would for
a small world: job ml/demo on attempt 2 (its Job demo-2 owns pod demo-2-0; the old attempt's Job demo-1
still has pod demo-1-0), job ml/other, a pod that only carries demo's label, and tokens shaped like
projected ServiceAccount tokens (JWTs) whose review result the fake knows.
"""

import asyncio
import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from finetune_operator import metrics
from finetune_operator.progress import auth as auth_module
from finetune_operator.progress.auth import (
    ACCEPT_SECONDS,
    GLOBAL_BURST,
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    RECHECK_SECONDS,
    REFUSE_SECONDS,
    SOURCE_BURST,
    Authenticator,
    audience,
)
from finetune_operator.progress.directory import JobFacts
from finetune_operator.progress.ratelimit import RateLimiter
from finetune_operator.render.names import progress_audience
from tests.builders import job

NOW = 1_900_000_000.0
DEMO = audience("ml", "demo")


def jwt(
    aud: str = DEMO, ns: str = "ml", pod: str | None = "demo-2-0", *, exp: float = NOW + 3600, tag: str = ""
) -> str:
    """A token shaped like a projected ServiceAccount token (the fake API decides whether it is valid)."""

    def part(obj: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    kube: dict[str, Any] = {"namespace": ns, "serviceaccount": {"name": "default"}}
    if pod:
        kube["pod"] = {"name": pod, "uid": "whatever"}
    payload = {"aud": [aud], "exp": exp, "iss": "https://kubernetes.default.svc", "kubernetes.io": kube, "tag": tag}
    return f"{part({'alg': 'RS256', 'kid': 'k'})}.{part(payload)}.c2lnbmF0dXJl"


@dataclass(frozen=True)
class Identity:
    """What the API server's TokenReview says about a token."""

    aud: str
    sa_namespace: str
    pod: str | None
    pod_uid: str | None


GOOD = jwt()
TOKENS: dict[str, Identity] = {
    GOOD: Identity(DEMO, "ml", "demo-2-0", "uid-a"),
    jwt(pod="demo-1-0"): Identity(DEMO, "ml", "demo-1-0", "uid-old-attempt"),
    jwt(pod="other-1-0"): Identity(DEMO, "ml", "other-1-0", "uid-b"),
    jwt(pod="rogue"): Identity(DEMO, "ml", "rogue", "uid-r"),
    jwt(pod="forged-owner"): Identity(DEMO, "ml", "forged-owner", "uid-f"),
    jwt(tag="stale"): Identity(DEMO, "ml", "demo-2-0", "uid-previous-pod"),
    jwt(tag="sa-elsewhere"): Identity(DEMO, "elsewhere", "demo-2-0", "uid-a"),
    jwt(aud=audience("ml", "other"), pod="other-1-0"): Identity(audience("ml", "other"), "ml", "other-1-0", "uid-b"),
}
PODS = {  # (ns, name) -> (uid, controller (kind, name, uid))
    ("ml", "demo-2-0"): ("uid-a", ("Job", "demo-2", "job-2")),
    ("ml", "demo-1-0"): ("uid-old-attempt", ("Job", "demo-1", "job-1")),
    ("ml", "other-1-0"): ("uid-b", ("Job", "other-1", "job-o")),
    ("ml", "rogue"): ("uid-r", None),
    ("ml", "forged-owner"): ("uid-f", ("Job", "demo-2", "not-the-jobs-uid")),
}
JOBS = {
    ("ml", "demo-2"): ("job-2", ("FineTuneJob", "demo", "ftj-demo")),
    ("ml", "demo-1"): ("job-1", ("FineTuneJob", "demo", "ftj-demo")),
    ("ml", "other-1"): ("job-o", ("FineTuneJob", "other", "ftj-other")),
}


@dataclass
class FakeApi:
    """TokenReview, pod and Job reads and the job directory of the world above; counts what was asked."""

    facts: dict[tuple[str, str], JobFacts] = field(
        default_factory=lambda: {
            ("ml", "demo"): JobFacts("ftj-demo", 2, "https://huggingface.co", "acme/demo-adapter"),
            ("ml", "other"): JobFacts("ftj-other", 1),
        }
    )
    pods: dict[tuple[str, str], Any] = field(default_factory=lambda: dict(PODS))
    reviews: int = 0
    reads: int = 0
    fail_reviews: bool = False

    async def review(self, token: str, aud: str) -> dict[str, Any]:
        self.reviews += 1
        if self.fail_reviews:
            raise ConnectionError("API server unreachable")
        who = TOKENS.get(token)
        if who is None or who.aud != aud:
            return {"authenticated": False, "error": "invalid bearer token"}
        extra = {POD_NAME_EXTRA: [who.pod], POD_UID_EXTRA: [who.pod_uid]} if who.pod else {}
        return {"authenticated": True, "audiences": [aud],
                "user": {"username": f"system:serviceaccount:{who.sa_namespace}:default", "extra": extra}}

    async def pod(self, ns: str, name: str) -> Any:
        self.reads += 1
        return self.pods.get((ns, name))

    async def job(self, ns: str, name: str) -> Any:
        self.reads += 1
        return JOBS.get((ns, name))

    async def lookup(self, ns: str, name: str) -> JobFacts | None:
        return self.facts.get((ns, name))

    def authenticator(self, clock: Callable[[], float] = time.monotonic, **kwargs: Any) -> Authenticator:
        return Authenticator(self.review, self.pod, self.job, self.lookup, clock=clock, wall=lambda: NOW, **kwargs)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def check(auth: Authenticator, token: str | None, source: str = "10.0.0.1", name: str = "demo") -> Any:
    return asyncio.run(auth.check("ml", name, token, source))


CASES = [
    ("the current attempt's pod-bound token is accepted", GOOD, 200, None),
    ("no token", None, 401, "no_token"),
    ("a string that is not a JWT", "garbage", 401, "malformed_token"),
    ("another job's token (audience)", jwt(aud=audience("ml", "other"), pod="other-1-0"), 401, "wrong_audience"),
    ("an expired token", jwt(exp=NOW - 120), 401, "expired_token"),
    ("a token of another namespace", jwt(ns="elsewhere"), 403, "other_namespace"),
    ("a token not bound to a pod", jwt(pod=None), 403, "not_pod_bound"),
    ("a well-formed token the API server refuses", jwt(tag="forged"), 401, "review_refused"),
    ("a ServiceAccount of another namespace behind forged claims", jwt(tag="sa-elsewhere"), 403, "not_service_account"),
    ("a token whose pod was replaced (uid)", jwt(tag="stale"), 403, "pod_replaced"),
    ("a pod of another job, same audience", jwt(pod="other-1-0"), 403, "not_attempt_pod"),
    ("a pod with the job's label but no owner", jwt(pod="rogue"), 403, "not_attempt_pod"),
    ("a pod claiming the attempt Job with a wrong uid", jwt(pod="forged-owner"), 403, "not_attempt_pod"),
    ("a pod of the previous attempt", jwt(pod="demo-1-0"), 403, "not_current_attempt"),
]


@pytest.mark.parametrize(("token", "status", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_token_decisions(token: str | None, status: int, reason: str | None) -> None:
    decision = check(FakeApi().authenticator(), token)
    assert (decision.status, decision.reason) == (status, reason)
    if decision.allowed:
        assert decision.pod == "demo-2-0" and decision.facts.uid == "ftj-demo"


@pytest.mark.parametrize("token", [None, "garbage", "a.b.c", jwt(aud=audience("ml", "other")), jwt(exp=NOW - 120),
                                   jwt(ns="elsewhere"), jwt(pod=None), "x" * 20_000],
                         ids=["none", "garbage", "three-dots", "wrong-aud", "expired", "other-ns", "unbound", "huge"])
def test_what_the_token_itself_rules_out_costs_no_review(token: str | None) -> None:
    api = FakeApi()
    decision = check(api.authenticator(), token)
    assert decision.status in (401, 403) and api.reviews == 0 and api.reads == 0


def test_a_garbage_flood_costs_no_reviews() -> None:
    api = FakeApi()
    auth = api.authenticator()

    async def flood() -> list[int]:
        return [(await auth.check("ml", "demo", f"garbage-{i}", "10.0.0.9")).status for i in range(2000)]

    assert set(asyncio.run(flood())) == {401}
    assert api.reviews == 0


def test_forged_jwts_from_one_source_are_reviewed_at_most_a_burst_then_429() -> None:
    api, clock = FakeApi(), Clock()
    auth = api.authenticator(clock)

    async def flood() -> list[Any]:
        return [await auth.check("ml", "demo", jwt(tag=f"forged-{i}"), "10.0.0.9") for i in range(200)]

    decisions = asyncio.run(flood())
    assert api.reviews == SOURCE_BURST
    assert {d.reason for d in decisions[int(SOURCE_BURST):]} == {"source_rate"}
    assert {d.status for d in decisions[int(SOURCE_BURST):]} == {429}
    assert check(auth, GOOD, source="10.0.0.2").allowed  # another source is not starved


def test_forged_jwts_from_many_sources_are_bounded_by_the_global_bucket() -> None:
    api, clock = FakeApi(), Clock()
    auth = api.authenticator(clock)

    async def flood() -> list[Any]:
        return [await auth.check("ml", "demo", jwt(tag=f"f{i}"), f"10.1.{i // 250}.{i % 250}") for i in range(1000)]

    decisions = asyncio.run(flood())
    assert api.reviews == GLOBAL_BURST
    assert {d.reason for d in decisions[int(GLOBAL_BURST):]} == {"global_rate"}


def test_a_refused_token_is_not_reviewed_again_until_the_negative_cache_expires() -> None:
    api, clock = FakeApi(), Clock()
    auth = api.authenticator(clock)
    forged = jwt(tag="forged")
    statuses = [check(auth, forged).status for _ in range(50)]
    assert statuses == [401] * 50 and api.reviews == 1
    assert check(auth, forged).reason == "refused_recently"
    clock.now += REFUSE_SECONDS + 1
    assert check(auth, forged).reason == "review_refused" and api.reviews == 2


def test_a_valid_token_refused_for_its_pod_is_looked_at_again_sooner() -> None:
    api, clock = FakeApi(), Clock()
    auth = api.authenticator(clock)
    old = jwt(pod="demo-1-0")
    assert [check(auth, old).status for _ in range(3)] == [403, 403, 403] and api.reviews == 1
    clock.now += RECHECK_SECONDS + 1
    assert check(auth, old).reason == "not_current_attempt" and api.reviews == 2


def test_an_accepted_token_is_cached_until_its_pod_goes() -> None:
    api, clock = FakeApi(), Clock()
    auth = api.authenticator(clock)
    assert all(check(auth, GOOD).allowed for _ in range(5)) and api.reviews == 1
    auth.forget_pod("uid-a")  # the operator's pod watch saw demo-2-0 deleted
    del api.pods[("ml", "demo-2-0")]
    assert check(auth, GOOD).reason == "pod_missing" and api.reviews == 2


def test_an_accepted_token_is_reviewed_again_after_the_cache_time() -> None:
    api, clock = FakeApi(), Clock()
    auth = api.authenticator(clock)
    assert check(auth, GOOD).allowed
    clock.now += ACCEPT_SECONDS - 1
    assert check(auth, GOOD).allowed and api.reviews == 1
    clock.now += 2
    assert check(auth, GOOD).allowed and api.reviews == 2


def test_the_cache_never_outlives_the_token() -> None:
    api, clock = FakeApi(), Clock()
    auth = api.authenticator(clock)
    short = jwt(exp=NOW + 5, tag="short")
    TOKENS[short] = TOKENS[GOOD]
    try:
        assert check(auth, short).allowed
        clock.now += 6
        assert check(auth, short).allowed and api.reviews == 2  # reviewed again (the fake's clock stands still)
    finally:
        del TOKENS[short]


def test_a_cached_token_stops_working_when_the_job_moves_to_another_attempt() -> None:
    api, clock = FakeApi(), Clock()
    auth = api.authenticator(clock)
    assert check(auth, GOOD).allowed
    api.facts[("ml", "demo")] = JobFacts("ftj-demo", 3, "https://huggingface.co", "acme/demo-adapter")
    assert check(auth, GOOD).reason == "not_current_attempt"
    api.facts[("ml", "demo")] = JobFacts("ftj-recreated", 2)  # deleted and created again under the same name
    clock.now += RECHECK_SECONDS + 1
    assert check(auth, GOOD).reason == "not_attempt_pod"


def test_an_unknown_job_is_refused_without_a_review() -> None:
    api = FakeApi()
    decision = check(api.authenticator(), jwt(aud=audience("ml", "ghost"), pod="ghost-1-0"), name="ghost")
    assert decision.reason == "unknown_job" and decision.status == 401 and api.reviews == 0


def test_concurrent_reviews_are_capped_and_the_excess_is_answered_at_once() -> None:
    api = FakeApi()
    release = asyncio.Event()
    in_flight, peak = [0], [0]

    async def slow_review(token: str, aud: str) -> dict[str, Any]:
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await release.wait()
        in_flight[0] -= 1
        return {"authenticated": False}

    async def scenario() -> list[Any]:
        auth = Authenticator(slow_review, api.pod, api.job, api.lookup, wall=lambda: NOW, max_reviews=4)
        tasks = [asyncio.create_task(auth.check("ml", "demo", jwt(tag=f"t{i}"), f"10.0.0.{i}")) for i in range(10)]
        await asyncio.sleep(0.05)
        answered_at_once = [t.result() for t in tasks if t.done()]
        assert {d.reason for d in answered_at_once} == {"review_busy"}
        release.set()
        return [await t for t in tasks]

    decisions = asyncio.run(scenario())
    assert peak[0] == 4
    assert sorted(d.reason for d in decisions) == ["review_busy"] * 6 + ["review_refused"] * 4


def test_an_api_failure_is_503_counted_and_not_cached() -> None:
    api, clock = FakeApi(fail_reviews=True), Clock()
    auth = api.authenticator(clock)
    before = metrics.PROGRESS_TOKEN_REVIEWS.labels("error")._value.get()
    assert [check(auth, GOOD).reason for _ in range(2)] == ["review_unavailable"] * 2
    assert metrics.PROGRESS_TOKEN_REVIEWS.labels("error")._value.get() == before + 2
    api.fail_reviews = False
    assert check(auth, GOOD).allowed


def test_every_review_is_counted_by_result() -> None:
    api = FakeApi()
    auth = api.authenticator(Clock())
    counter = metrics.PROGRESS_TOKEN_REVIEWS
    before = {r: counter.labels(r)._value.get() for r in ("authenticated", "refused")}
    check(auth, GOOD)
    check(auth, jwt(tag="forged"))
    check(auth, "garbage")
    assert counter.labels("authenticated")._value.get() == before["authenticated"] + 1
    assert counter.labels("refused")._value.get() == before["refused"] + 1


def test_caches_are_swept_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth_module, "MAX_CACHED", 20)
    api, clock = FakeApi(), Clock()
    auth = api.authenticator(clock, per_source=RateLimiter(rate=1e9, burst=1e9), overall=RateLimiter(1e9, 1e9))
    for i in range(100):
        check(auth, jwt(tag=f"forged-{i}"))
    assert auth.cached()[1] <= 20
    check(auth, GOOD)
    assert auth.cached()[0] == 1
    clock.now += max(ACCEPT_SECONDS, REFUSE_SECONDS) + 1
    auth.sweep()
    assert auth.cached() == (0, 0)


def test_the_audience_matches_what_render_puts_in_the_pod() -> None:
    j = job(name="demo", namespace="ml")
    assert audience("ml", "demo") == progress_audience(j)


def test_rate_limit_allows_a_burst_then_one_per_second_per_key() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=1.0, burst=2.0, clock=lambda: now[0])
    assert [limiter.allow(("ml", "a")) for _ in range(3)] == [True, True, False]
    assert limiter.allow(("ml", "b"))
    now[0] = 1.0
    assert [limiter.allow(("ml", "a")) for _ in range(2)] == [True, False]


def test_rate_limit_keeps_a_bounded_number_of_buckets_and_still_limits() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=1.0, burst=1.0, clock=lambda: now[0], max_keys=100)
    for i in range(10_000):
        limiter.allow(f"10.0.{i // 256}.{i % 256}")
    assert len(limiter) <= 100
    assert limiter.allow("10.9.9.9") and not limiter.allow("10.9.9.9")
