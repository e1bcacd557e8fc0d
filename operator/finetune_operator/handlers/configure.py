"""Startup and cleanup: kopf settings, the API client, the progress and metrics servers, wake-ups.

`configure()` is the one place that changes kopf settings (each with why); everything it creates
goes into memo as one `OperatorState`. `shutdown()` stops the servers and closes the client.
"""

import asyncio
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
    """Once at start: settings, client, progress endpoint (HTTPS), /metrics and the wake-up task."""
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
