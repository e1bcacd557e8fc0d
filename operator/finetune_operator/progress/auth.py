"""Who may push progress for a job: a pod-bound ServiceAccount token whose audience names the job.

The check is TokenReview (authenticated, audience `names.progress_audience(job)`, a ServiceAccount
of the job's namespace, bound to a pod) plus a look at that pod: it must exist with the same uid
and carry `finetune.dev/job-name=<job>`. Another job's token fails the audience; a token of an
unrelated pod fails the label. The API calls are injected so the rules are unit-tested without a
cluster. Tokens are never logged or kept, only a hash of accepted ones for a short while.
"""

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from finetune_api import constants

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
CACHE_SECONDS = 60.0  # an accepted token is trusted this long without a new TokenReview

ReviewFn = Callable[[str, str], Awaitable[dict[str, Any]]]  # (token, audience) -> TokenReview status
PodFn = Callable[[str, str], Awaitable[tuple[str, dict[str, str]] | None]]  # (ns, pod) -> (uid, labels)


@dataclass(frozen=True)
class Decision:
    """The answer: HTTP status (200, 401, 403) and a reason safe to return to the caller."""

    status: int
    reason: str
    pod: str | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200


def audience(namespace: str, name: str) -> str:
    """Same string as `render.names.progress_audience`, without building a FineTuneJob."""
    return f"{constants.GROUP}/progress/{namespace}/{name}"


def _first(extra: dict[str, Any], key: str) -> str | None:
    values = extra.get(key) or []
    return str(values[0]) if values else None


@dataclass
class Authenticator:
    """Checks bearer tokens for (namespace, job); caches accepted ones by hash for CACHE_SECONDS."""

    review: ReviewFn
    pod: PodFn
    clock: Callable[[], float] = time.monotonic
    _cache: dict[tuple[str, str, str], tuple[float, str]] = field(default_factory=dict)

    async def check(self, namespace: str, name: str, token: str | None) -> Decision:
        """Decide whether this token may report progress for this job."""
        if not token:
            return Decision(401, "missing bearer token")
        digest = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get((namespace, name, digest))
        if cached and cached[0] > self.clock():
            return Decision(200, "ok", cached[1])
        decision = await self._review(namespace, name, token)
        if decision.allowed and decision.pod:
            self._cache[(namespace, name, digest)] = (self.clock() + CACHE_SECONDS, decision.pod)
        return decision

    async def _review(self, namespace: str, name: str, token: str) -> Decision:
        aud = audience(namespace, name)
        status = await self.review(token, aud)
        if not status.get("authenticated") or aud not in (status.get("audiences") or [aud]):
            return Decision(401, "token not valid for this job's audience")
        user = status.get("user") or {}
        prefix = f"system:serviceaccount:{namespace}:"
        if not str(user.get("username", "")).startswith(prefix):
            return Decision(403, "token is not a ServiceAccount token of this namespace")
        extra = user.get("extra") or {}
        pod_name = _first(extra, POD_NAME_EXTRA)
        if pod_name is None:
            return Decision(403, "token is not bound to a pod")
        found = await self.pod(namespace, pod_name)
        if found is None:
            return Decision(403, "the token's pod does not exist")
        uid, labels = found
        pod_uid = _first(extra, POD_UID_EXTRA)
        if pod_uid is not None and pod_uid != uid:
            return Decision(403, "the token's pod was replaced")
        if labels.get(constants.LABEL_JOB_NAME) != name:
            return Decision(403, "the token's pod does not belong to this job")
        return Decision(200, "ok", pod_name)
