"""Startup and cleanup: kopf settings, the API client, the progress and metrics servers, wake-ups.

`configure()` is the one place that changes kopf settings (each with why); everything it creates
goes into memo as one `OperatorState`. `shutdown()` stops the servers and closes the client.
It also tunes Python's cyclic garbage collector (`tune_gc`) for a process that decodes thousands of
watch events a minute.
"""

import asyncio
import gc
import logging
from functools import partial
from typing import Any

import kopf

from finetune_api import constants
from finetune_operator.handlers.kube import Kube
from finetune_operator.handlers.reconciling import reconcile_job
from finetune_operator.handlers.state import OperatorConfig, OperatorState
from finetune_operator.progress.auth import Authenticator
from finetune_operator.progress.directory import JobDirectory
from finetune_operator.progress.ratelimit import RateLimiter
from finetune_operator.progress.server import build_app, build_metrics_app
from finetune_operator.progress.serving import ConnectionGate, serve
from finetune_operator.progress.tls import server_context

CHILD_SELECTOR = f"{constants.LABEL_MANAGED_BY}={constants.MANAGED_BY}"


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff-base at all: this operator registers no on.create/update/delete/resume handlers, so
    kopf never diffs, yet its default storage deep-copies every event's body (of every watched
    resource) to build one. `tests/unit/test_handlers_registry.py` keeps that premise true."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


GC_YOUNG_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation (Python's default: 700). Each watch event is
decoded into a few hundred dicts and lists that mostly die by reference counting; at 700 the collector ran
about once per event and moved the survivors of the moment into the older generations, whose collections then
walked them again, all of the process's objects in a full collection. In a 100-job burst the collector took
0.34 s of the operator's ~2.4 s of CPU (0.19 s in two full collections), 0.17 s with this threshold after
`gc.freeze` (bench/operator/README.md, "One callback per child event")."""


def tune_gc() -> None:
    """Once the operator has started: what exists now (modules, kopf's registry, the client) lives as long as the
    process, so the collector stops walking it (`gc.freeze`), and the youngest generation is collected less often
    (`GC_YOUNG_THRESHOLD`; the older generations keep their default ratios)."""
    _, middle, old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def _settings(settings: kopf.OperatorSettings) -> None:
    # Our own finalizer name, though no handler needs one today (children go by ownerReference GC).
    settings.persistence.finalizer = constants.FINALIZER
    # Handler progress (unused: no changing handlers) in annotations under finetune.dev/, never in our strict status.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=constants.GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    # We post our own events per transition; kopf's per-handler chatter only from WARNING up.
    settings.posting.level = logging.WARNING
    # Watch only our children server-side, not every pod/ConfigMap of the cluster (kopf 1.45+).
    for resource in (("batch", "jobs"), ("", "pods"), ("", "configmaps"), ("", "services")):
        settings.watching.label_selectors[resource] = CHILD_SELECTOR
    # Reconnect watches every 5 min and notice a silent stream in 70 s (nolar/kopf#787, #1276).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    # A stuck API call must not hold a job's reconcile for kopf's default 300 s.
    settings.networking.request_timeout = 30
    # Unlimited workers: a limit below the number of indexed objects deadlocks startup (nolar/kopf#1243).
    settings.queueing.worker_limit = None
    # Retry framework errors quickly at first; our own API errors are requeued by the reconciler.
    settings.queueing.error_delays = [1, 2, 5, 10, 30, 60]


@kopf.on.startup(id="configure")
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Once at start: settings, client, progress endpoint (HTTPS), /metrics, the wake-up and burst tasks."""
    _settings(settings)
    config: OperatorConfig = memo["config"]
    state = OperatorState(config=config, kube=await Kube.connect())
    memo["state"] = state
    # Who may report: what the watch knows of each job (a GET where it knows nothing), TokenReview, owner chain.
    directory = JobDirectory(known=state.bodies.get, fetch=state.kube.get_finetunejob)
    auth = Authenticator(
        review=state.kube.review_token,
        pod=partial(state.kube.controlled_by, "Pod"),
        job=partial(state.kube.controlled_by, "Job"),
        jobs=directory.lookup,
    )
    state.progress_auth = auth

    tls = server_context(config.progress_cert, config.progress_key)
    progress = await serve(build_app(auth, RateLimiter(), state.kube.patch_status), config.progress_port, tls)
    scrapes = await serve(build_metrics_app(), config.metrics_port, gate=ConnectionGate(observed=False))
    memo["runners"] = [progress[0], scrapes[0]]

    async def wake(key: tuple[str, str], reread: bool) -> None:
        if await state.peering.active(key[0]):  # kopf pauses handlers in a standby replica, not our task
            await reconcile_job(state, key, reread=reread)

    state.background.append(asyncio.create_task(state.wakeups.run(wake)))
    # A status write held for a burst's end is written by a wake-up of its job's round once released.
    state.background.append(asyncio.create_task(state.burst.run(lambda key: state.wakeups.schedule(key, 0))))
    tune_gc()
    logger.info("progress endpoint on :%s (HTTPS), metrics on :%s", config.progress_port, config.metrics_port)


@kopf.on.cleanup(id="shutdown")
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    """On exit: stop servers and the wake-up task, close the API client."""
    for runner in memo.get("runners", []):
        await runner.cleanup()
    state: OperatorState | None = memo.get("state")
    if state is not None:
        for task in [*state.background, *state.triggered]:
            task.cancel()
        await state.kube.close()
