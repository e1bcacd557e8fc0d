"""What the progress endpoint needs to know of a FineTuneJob, and where it gets it cheaply.

`JobFacts` is the job's uid, its current attempt and its Hub output (endpoint and repo id): enough to
check that a pod belongs to the current attempt and that a reported output points where the spec
says. `JobDirectory.lookup` reads them from the body the operator's own watch last delivered (free,
in the replica whose watches run), else GETs the job and keeps the answer, found or not, for a few
seconds: a replica on standby under kopf peering has no watch events but still serves pushes that
the Service sends it.
"""

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_HUB_ENDPOINT = "https://huggingface.co"
"""Where a Hub output goes when `spec.output.hub.endpoint` is not set (huggingface_hub's default)."""
LOOKUP_SECONDS = 5.0
"""How long a GET's answer (found or not) stands in for the job on a replica without its watch."""
MAX_ENTRIES = 10_000

Key = tuple[str, str]
KnownFn = Callable[[Key], Mapping[str, Any] | None]
FetchFn = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]


@dataclass(frozen=True)
class JobFacts:
    """The parts of one FineTuneJob that decide who may report for it and what."""

    uid: str
    attempt: int
    hub_endpoint: str | None = None
    """`spec.output.hub.endpoint` (or the default) when the job pushes to a Hub; None: no Hub output."""
    hub_repo: str | None = None


def job_facts(body: Mapping[str, Any]) -> JobFacts | None:
    """The facts of a job body; None for one that is being deleted or has no uid (never a valid target)."""
    meta = body.get("metadata") or {}
    uid = meta.get("uid")
    if not uid or meta.get("deletionTimestamp"):
        return None
    hub = ((body.get("spec") or {}).get("output") or {}).get("hub")
    attempt = (body.get("status") or {}).get("attempt")
    return JobFacts(
        uid=str(uid),
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0,
        hub_endpoint=str(hub.get("endpoint") or DEFAULT_HUB_ENDPOINT) if isinstance(hub, dict) else None,
        hub_repo=str(hub["repoId"]) if isinstance(hub, dict) and hub.get("repoId") else None,
    )


@dataclass
class JobDirectory:
    """`known`: the watch's newest body of a job (no I/O); `fetch`: GET it (None when it does not exist)."""

    known: KnownFn
    fetch: FetchFn
    clock: Callable[[], float] = time.monotonic
    _fetched: dict[Key, tuple[float, JobFacts | None]] = field(default_factory=dict)

    async def lookup(self, namespace: str, name: str) -> JobFacts | None:
        """The job's facts, or None when no such job exists (or it is being deleted)."""
        key = (namespace, name)
        body = self.known(key)
        if body is not None:
            return job_facts(body)
        now = self.clock()
        cached = self._fetched.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        fetched = await self.fetch(namespace, name)
        facts = job_facts(fetched) if fetched is not None else None
        if len(self._fetched) >= MAX_ENTRIES:
            self._fetched = {k: v for k, v in self._fetched.items() if v[0] > now}
            if len(self._fetched) >= MAX_ENTRIES:
                self._fetched.clear()
        self._fetched[key] = (now + LOOKUP_SECONDS, facts)
        return facts
