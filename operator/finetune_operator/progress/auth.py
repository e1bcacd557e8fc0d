"""Who may push progress for a job: a pod of the job's current attempt, by its projected token.

The pod presents a ServiceAccount token whose audience names the job (`audience`), bound to the pod.
The real checks are a TokenReview (authenticated, that audience, a ServiceAccount of the job's
namespace, bound to a pod that still exists with the same uid) and the pod's owner chain: its
controller is the Job of the job's *current* attempt (`status.attempt`), and that Job's controller is
this FineTuneJob (by uid). A label is not enough: anyone who may create pods may set labels.

A TokenReview is an API call, so it is the last step, behind checks that cost nothing:

1. the token must look like a projected token for this job (`claims.early_refusal`: a JWT with this
   job's audience, not expired, bound to a pod of this namespace; unverified, so it can only refuse);
2. a token accepted lately is served from the positive cache (still only while the job's attempt is
   the one it was accepted for); one refused lately is refused again from the negative cache;
3. per client address and for the whole endpoint, token buckets bound the reviews a flood can cause;
4. the job must exist (`directory`), and at most `MAX_CONCURRENT_REVIEWS` reviews run at once; past
   that the answer is 503 at once rather than a queue.

The positive cache is bounded, swept every `SWEEP_SECONDS`, never outlives the token's own `exp`, and
drops a pod's entries when the pod goes (`forget_pod`, from the operator's pod events). The API calls
are injected, so every rule is unit-tested without a cluster. Tokens are never logged or kept: only a
SHA-256 of each, as the cache key.
"""

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from finetune_api import constants
from finetune_operator import metrics
from finetune_operator.progress.claims import early_refusal, peek
from finetune_operator.progress.directory import JobFacts
from finetune_operator.progress.ratelimit import RateLimiter
from finetune_operator.progress.reasons import ANSWERS, Reason
from finetune_operator.render.names import attempt_job_name_of

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
ACCEPT_SECONDS = 30.0
"""An accepted token is trusted this long without a new review (less if the token expires sooner). A pod's
deletion drops it at once where the operator's pod watch runs; a standby replica has none, so this bounds it."""
REFUSE_SECONDS = 60.0
"""A token the TokenReview refused is refused again this long without one (it cannot become valid)."""
RECHECK_SECONDS = 10.0
"""A valid token refused for what its pod is (not the current attempt's, gone) is looked at again after this."""
SWEEP_SECONDS = 10.0
MAX_CACHED = 10_000
"""Entries in each of the positive and negative caches; past it the oldest go first."""
MAX_CONCURRENT_REVIEWS = 8
"""TokenReviews (with their pod and Job reads) in flight at once; more are answered 503 at once."""
REVIEW_TIMEOUT_SECONDS = 5.0
SOURCE_RATE, SOURCE_BURST = 2.0, 10.0
"""Reviews a second per client address, and the burst: a trainer needs one per ACCEPT_SECONDS."""
GLOBAL_RATE, GLOBAL_BURST = 50.0, 100.0
"""Reviews a second for the whole endpoint (1,000 jobs need about 33), and the burst."""

ReviewFn = Callable[[str, str], Awaitable[dict[str, Any]]]
"""(token, audience) -> the TokenReview's status as a plain dict."""
Controller = tuple[str, str, str]
"""A controlling ownerReference: (kind, name, uid)."""
OwnedFn = Callable[[str, str], Awaitable[tuple[str, Controller | None] | None]]
"""(namespace, name) -> (uid, controller) of a Pod or a Job; None when it does not exist."""
LookupFn = Callable[[str, str], Awaitable[JobFacts | None]]
log = logging.getLogger(__name__)


def audience(namespace: str, name: str) -> str:
    """Same string as `render.names.progress_audience`, without building a FineTuneJob."""
    return f"{constants.GROUP}/progress/{namespace}/{name}"


@dataclass(frozen=True)
class Decision:
    """The answer: HTTP status, the reason code when refused, and for an accepted token its pod and job."""

    status: int
    reason: Reason | None = None
    pod: str | None = None
    facts: JobFacts | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200

    @property
    def message(self) -> str:
        """Text safe to return to the caller."""
        return ANSWERS[self.reason][1] if self.reason else "ok"


def refuse(reason: Reason, status: int | None = None) -> Decision:
    return Decision(status or ANSWERS[reason][0], reason)


@dataclass(frozen=True)
class _Accepted:
    pod: str
    pod_uid: str
    job_uid: str
    attempt: int
    expires: float


@dataclass(frozen=True)
class _Refused:
    status: int
    expires: float


CacheKey = tuple[str, str, str]  # (namespace, job, sha256 of the token)


def _first(extra: dict[str, Any], key: str) -> str | None:
    values = extra.get(key) or []
    return str(values[0]) if values else None


@dataclass
class Authenticator:
    """Checks bearer tokens for (namespace, job). See the module docstring for the order of checks."""

    review: ReviewFn
    pod: OwnedFn
    job: OwnedFn
    jobs: LookupFn
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    per_source: RateLimiter = field(default_factory=lambda: RateLimiter(rate=SOURCE_RATE, burst=SOURCE_BURST))
    overall: RateLimiter = field(default_factory=lambda: RateLimiter(rate=GLOBAL_RATE, burst=GLOBAL_BURST))
    max_reviews: int = MAX_CONCURRENT_REVIEWS
    _accepted: dict[CacheKey, _Accepted] = field(default_factory=dict)
    _by_pod: dict[str, set[CacheKey]] = field(default_factory=dict)
    _refused: dict[CacheKey, _Refused] = field(default_factory=dict)
    _in_flight: int = 0
    _next_sweep: float = 0.0

    def __post_init__(self) -> None:
        self.per_source.clock = self.overall.clock = self.clock

    async def check(self, namespace: str, name: str, token: str | None, source: str | None = None) -> Decision:
        """Decide whether this token may report progress for this job; `source` is the client's address."""
        if not token:
            return refuse("no_token")
        claims = peek(token)
        early = early_refusal(claims, audience(namespace, name), namespace, self.wall())
        if early is not None or claims is None or claims.expires is None:
            return refuse(early or "malformed_token")
        now = self.clock()
        self._sweep_if_due(now)
        key = (namespace, name, hashlib.sha256(token.encode()).hexdigest())
        try:
            hit = self._accepted.get(key)
            if hit is not None:
                if hit.expires > now:
                    facts = await self.jobs(namespace, name)
                    if facts is not None and (facts.uid, facts.attempt) == (hit.job_uid, hit.attempt):
                        return Decision(200, pod=hit.pod, facts=facts)
                self._drop(key)  # expired, or the job moved on: look again below
            refused = self._refused.get(key)
            if refused is not None and refused.expires > now:
                return refuse("refused_recently", refused.status)
            if not self.per_source.allow(source):
                return refuse("source_rate")
            if not self.overall.allow():
                return refuse("global_rate")
            facts = await self.jobs(namespace, name)
            if facts is None:
                self._remember_refusal(key, ANSWERS["unknown_job"][0], now + RECHECK_SECONDS)
                return refuse("unknown_job")
            if self._in_flight >= self.max_reviews:
                return refuse("review_busy")
            self._in_flight += 1
            try:
                decision, pod_uid = await self._review(namespace, name, token, facts)
            finally:
                self._in_flight -= 1
        except Exception as exc:  # an API error or timeout: the caller may retry; never a 500
            log.warning("progress auth for %s/%s could not finish: %s", namespace, name, type(exc).__name__)
            return refuse("review_unavailable")
        now = self.clock()
        if decision.allowed and decision.pod and pod_uid:
            lifetime = min(ACCEPT_SECONDS, claims.expires - self.wall())
            self._remember(key, _Accepted(decision.pod, pod_uid, facts.uid, facts.attempt, now + lifetime))
        elif decision.reason == "review_refused":
            self._remember_refusal(key, decision.status, now + REFUSE_SECONDS)
        elif not decision.allowed:
            self._remember_refusal(key, decision.status, now + RECHECK_SECONDS)
        return decision

    async def _review(self, namespace: str, name: str, token: str, facts: JobFacts) -> tuple[Decision, str | None]:
        """TokenReview, then the pod and its owner chain; the pod's uid along with an acceptance."""
        aud = audience(namespace, name)
        try:
            status = await asyncio.wait_for(self.review(token, aud), REVIEW_TIMEOUT_SECONDS)
        except Exception:
            metrics.PROGRESS_TOKEN_REVIEWS.labels("error").inc()
            raise
        authenticated = bool(status.get("authenticated")) and aud in (status.get("audiences") or [aud])
        metrics.PROGRESS_TOKEN_REVIEWS.labels("authenticated" if authenticated else "refused").inc()
        if not authenticated:
            return refuse("review_refused"), None
        user = status.get("user") or {}
        if not str(user.get("username", "")).startswith(f"system:serviceaccount:{namespace}:"):
            return refuse("not_service_account"), None
        extra = user.get("extra") or {}
        pod_name, pod_uid = _first(extra, POD_NAME_EXTRA), _first(extra, POD_UID_EXTRA)
        if pod_name is None or pod_uid is None:
            return refuse("not_pod_bound"), None
        pod = await self.pod(namespace, pod_name)
        if pod is None:
            return refuse("pod_missing"), None
        if pod[0] != pod_uid:
            return refuse("pod_replaced"), None
        why = await self._not_current_attempt_pod(namespace, name, pod[1], facts)
        return (refuse(why), None) if why else (Decision(200, pod=pod_name, facts=facts), pod_uid)

    async def _not_current_attempt_pod(
        self, namespace: str, name: str, controller: Controller | None, facts: JobFacts
    ) -> Reason | None:
        """None when the pod's controller is a Job whose controller is this FineTuneJob (by uid) and that
        Job is the current attempt's; else why not."""
        if controller is None or controller[0] != "Job":
            return "not_attempt_pod"
        _, job_name, job_uid = controller
        job = await self.job(namespace, job_name)
        if job is None or job[0] != job_uid:
            return "not_attempt_pod"
        owner = job[1]
        if owner is None or owner[0] != constants.KIND or owner[2] != facts.uid:
            return "not_attempt_pod"
        if facts.attempt < 1 or job_name != attempt_job_name_of(name, facts.attempt):
            return "not_current_attempt"
        return None

    def forget_pod(self, pod_uid: str) -> None:
        """The pod is gone (or going): its tokens need a new review (which a deleted pod's token fails)."""
        for key in self._by_pod.pop(pod_uid, set()):
            self._accepted.pop(key, None)

    def sweep(self) -> None:
        """Drop expired entries of both caches."""
        now = self.clock()
        for key in [k for k, v in self._accepted.items() if v.expires <= now]:
            self._drop(key)
        self._refused = {k: v for k, v in self._refused.items() if v.expires > now}

    def cached(self) -> tuple[int, int]:
        """Sizes of the positive and negative caches (for tests and the gauge)."""
        return len(self._accepted), len(self._refused)

    def _sweep_if_due(self, now: float) -> None:
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_SECONDS
            self.sweep()

    def _drop(self, key: CacheKey) -> None:
        entry = self._accepted.pop(key, None)
        if entry is not None:
            keys = self._by_pod.get(entry.pod_uid)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_pod[entry.pod_uid]

    def _remember(self, key: CacheKey, entry: _Accepted) -> None:
        if len(self._accepted) >= MAX_CACHED:
            self.sweep()
            while len(self._accepted) >= MAX_CACHED:
                self._drop(next(iter(self._accepted)))
        self._accepted[key] = entry
        self._by_pod.setdefault(entry.pod_uid, set()).add(key)

    def _remember_refusal(self, key: CacheKey, status: int, expires: float) -> None:
        if len(self._refused) >= MAX_CACHED:
            self.sweep()
            while len(self._refused) >= MAX_CACHED:
                del self._refused[next(iter(self._refused))]
        self._refused[key] = _Refused(status, expires)
