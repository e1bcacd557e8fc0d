"""What the operator keeps between handler calls: its flags, its API client, locks and wake-ups.

One `OperatorState` is created by `configure()` at startup and put in kopf's memo; kopf copies the
memo shallowly into every object's memo, so all handlers share this one instance (no module
globals). The job bodies it keeps are never older than this process's own writes (`Bodies`).
"""

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from finetune_operator.handlers.kube import Kube
from finetune_operator.policy import PodPolicy
from finetune_operator.progress.auth import Authenticator
from finetune_operator.render import RenderOptions
from finetune_operator.render.cache import RenderCache

Key = tuple[str, str]
Signature = tuple[str, int, tuple[tuple[str, str], ...], bool]


@dataclass(frozen=True)
class OperatorConfig:
    """Flags of `ftjob operator` that the handlers need."""

    image: str
    policy: PodPolicy = field(default_factory=PodPolicy)
    """What a job's spec.template may ask for (the `--allowed-*` and `--pod-security-level` flags)."""
    progress_url: str | None = None
    progress_port: int = 8443
    progress_cert: str | None = None
    progress_key: str | None = None
    progress_hosts: tuple[str, ...] = ()
    progress_ca: str | None = None
    """PEM the trainer pins (the self-signed cert, or --progress-ca); None: the system trust store."""
    metrics_port: int = 9090
    resync_seconds: float = 300.0
    """Safety-net reconcile period (less up to 10% jitter); the hot path is event-driven, this only catches
    missed events. At 60 s, 1,000 active jobs cost 17 re-reads a second (6 per job in a 7-minute burst)."""
    max_concurrent_reconciles: int = 16
    """Rounds in flight at once, over all jobs (each is a few API calls; more only queue at the API server)."""
    peering_name: str | None = None
    priority: int = 0
    identity: str = ""
    clusterwide: bool = True

    def render_options(self, namespace: str, name: str) -> RenderOptions:
        """What this deployment adds to every job: image, pod policy, and the job's own progress URL and CA."""
        url = None
        if self.progress_url:
            url = f"{self.progress_url.rstrip('/')}/v1/namespaces/{namespace}/finetunejobs/{name}/progress"
        return RenderOptions(image=self.image, policy=self.policy, progress_url=url, progress_ca=self.progress_ca)


@dataclass
class Triggers:
    """What of each FineTuneJob the reconciler last reacted to: the parts a reconcile depends on
    besides its own status (uid, generation = spec, labels, being deleted)."""

    seen: dict[Key, Signature] = field(default_factory=dict)

    @staticmethod
    def signature(body: Mapping[str, Any]) -> Signature:
        meta = body["metadata"]
        labels = tuple(sorted((meta.get("labels") or {}).items()))
        return str(meta.get("uid")), int(meta.get("generation") or 0), labels, bool(meta.get("deletionTimestamp"))

    def changed(self, key: Key, signature: Signature) -> bool:
        """True (and remembered) when the job is new to this process or differs from the last sighting."""
        if self.seen.get(key) == signature:
            return False
        self.seen[key] = signature
        return True

    def forget(self, key: Key) -> None:
        self.seen.pop(key, None)


def _resource_version(body: Mapping[str, Any]) -> int | None:
    try:
        return int(body["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


@dataclass
class Bodies:
    """The newest body of each FineTuneJob this process has seen: from its watch events and from the
    answers to our own status writes (managedFields dropped: ~12 KB a job).

    A round triggered by an event reads it instead of GETting the job (6 GETs a job in a burst). It is
    never older than our last status write: of two bodies, the one with the higher resourceVersion wins
    (etcd revisions; a version that is not a number defers to arrival order).
    """

    latest: dict[Key, dict[str, Any]] = field(default_factory=dict)

    def offer(self, key: Key, body: Mapping[str, Any]) -> None:
        known = self.latest.get(key)
        new, old = _resource_version(body), _resource_version(known) if known is not None else None
        if known is not None and new is not None and old is not None and new < old:
            return  # an event older than a status write of ours that we already hold
        meta = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
        self.latest[key] = {**body, "metadata": meta}

    def get(self, key: Key) -> dict[str, Any] | None:
        return self.latest.get(key)

    def forget(self, key: Key) -> None:
        self.latest.pop(key, None)


@dataclass
class OperatorState:
    """Shared, process-local state; created once by `configure()`."""

    config: OperatorConfig
    kube: Kube
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    dirty: set[Key] = field(default_factory=set)
    indexes: dict[str, Any] = field(default_factory=dict)
    """kopf's index views, captured from the first handler call for the wake-up task."""
    wakeups: "asyncio.Queue[tuple[float, Key]]" = field(default_factory=asyncio.Queue)
    background: list["asyncio.Task[Any]"] = field(default_factory=list)
    peer_cache: dict[str | None, tuple[float, bool]] = field(default_factory=dict)
    triggers: Triggers = field(default_factory=Triggers)
    bodies: Bodies = field(default_factory=Bodies)
    reread: set[Key] = field(default_factory=set)
    """Jobs whose next round must GET the job (timer wake-ups: the safety net must not trust the watch)."""
    status_written: dict[Key, float] = field(default_factory=dict)
    """When each job's status was last written (monotonic clock), to batch ready-count changes."""
    renders: RenderCache = field(default_factory=RenderCache)
    progress_auth: Authenticator | None = None
    """The progress endpoint's token checker (set by `configure`): told when a trainer pod goes."""
    slots: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.config.max_concurrent_reconciles)

    def lock(self, key: Key) -> asyncio.Lock:
        """One lock per job: reconciles of the same job never interleave in this process."""
        return self.locks.setdefault(key, asyncio.Lock())
