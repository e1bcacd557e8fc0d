"""What the operator keeps between handler calls: its flags, its API client and the runtime's parts.

One `OperatorState` is created by `configure()` at startup and put in kopf's memo; kopf copies the
memo shallowly into every object's memo, so all handlers share this one instance (no module
globals). The work queue, wake-ups, body cache, change check and peering gate are the runtime's
(`finetune_operator.runtime`); this module wires them to the flags and the API client.
"""

import asyncio
from dataclasses import dataclass, field
from typing import Any

from finetune_operator.admit import AdmissionCache
from finetune_operator.handlers.kube import Kube
from finetune_operator.policy import PodPolicy
from finetune_operator.progress.auth import Authenticator
from finetune_operator.render import RenderOptions
from finetune_operator.render.memo import RenderMemo
from finetune_operator.runtime import Bodies, Burst, ChildTriggers, Key, PeeringGate, Triggers, Wakeups, WorkQueue


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
class OperatorState:
    """Shared, process-local state; created once by `configure()`."""

    config: OperatorConfig
    kube: Kube
    indexes: dict[str, Any] = field(default_factory=dict)
    """kopf's index views, captured from the first handler call for the wake-up task."""
    indexed: bool = False
    """Whether kopf has filled every index (it calls a handler only then): from then on a child's index function
    may trigger a round (`handlers/jobs.py`)."""
    background: list["asyncio.Task[Any]"] = field(default_factory=list)
    triggered: set["asyncio.Task[None]"] = field(default_factory=set)
    """Rounds that a child's index function started, each in its own task, until they end."""
    triggers: Triggers = field(default_factory=Triggers)
    children: ChildTriggers = field(default_factory=ChildTriggers)
    bodies: Bodies = field(default_factory=Bodies)
    wakeups: Wakeups = field(default_factory=Wakeups)
    burst: Burst = field(default_factory=Burst)
    """Whether a burst of new jobs is on, and the jobs whose status writes wait for its end."""
    status_written: dict[Key, float] = field(default_factory=dict)
    """When each job's status was last written (monotonic clock), to batch ready-count changes."""
    details_seen: dict[Key, float] = field(default_factory=dict)
    """Since when each job has a ready-count or message change waiting to be written (monotonic clock)."""
    admissions: AdmissionCache = field(default_factory=AdmissionCache)
    """Each job's admission (validity and memory plan) per spec generation: `reconcile` admits once a round."""
    renders: RenderMemo = field(default_factory=RenderMemo)
    """Each job's rendering per (uid, generation, labels, attempt, options): a round renders a job once per spec,
    not once per child event (rendering was 21% of the operator's CPU in a 300-job burst without it)."""
    progress_auth: Authenticator | None = None
    """The progress endpoint's token checker (set by `configure`): told when a trainer pod goes."""
    queue: WorkQueue = field(init=False)
    peering: PeeringGate = field(init=False)

    def __post_init__(self) -> None:
        self.queue = WorkQueue(slots=self.config.max_concurrent_reconciles, wakeups=self.wakeups)
        self.peering = PeeringGate(
            peering_name=self.config.peering_name,
            identity=self.config.identity,
            priority=self.config.priority,
            clusterwide=self.config.clusterwide,
            fetch=lambda name, namespace: self.kube.get_peering(name, namespace),
        )
