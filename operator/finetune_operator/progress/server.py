"""The aiohttp app: `POST /v1/namespaces/{ns}/finetunejobs/{name}/progress` and `GET /metrics`.

Order of checks: declared size (413), bearer token (`auth`: 401/403, or 429/503 when reviews are
rationed), the job's rate (429), the body within `BODY_TIMEOUT_SECONDS` (408, 413), the report
(`TrainerReport`: 400), what the job allows it to say (`validate`: 422), then a status patch of
`progress` and `output` only (503 when it fails, 404 when the job is gone). Every answer is a small
JSON object `{result, reason, message}` with a reason from `reasons`, counted in
`finetune_progress_pushes_total{result}` and, for refusals, `finetune_progress_rejected_total{reason}`;
anything unexpected is a logged 500 with the same shape, never a traceback. Answers never carry the
token or the body. The status writer is injected, so the app is unit-tested with fakes.

An accepted report also sets `progress.summary` (the PROGRESS column: `70% (7/10)`) from its numbers, and the
job's `finetune_job_*` gauges (`metrics.JOB_SERIES`); `GET /metrics` first drops the series no report has
refreshed for an hour (`metrics.JOB_SERIES_TTL_SECONDS`).
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from finetune_api.v1alpha1.status import Progress, TrainerReport
from finetune_operator import metrics
from finetune_operator.metrics import NOT_TRAINING_PHASES
from finetune_operator.progress.auth import Authenticator
from finetune_operator.progress.ratelimit import RateLimiter
from finetune_operator.progress.reasons import ANSWERS, QUIET, RESULTS, Reason
from finetune_operator.progress.serving import BODY_TIMEOUT_SECONDS
from finetune_operator.progress.validate import output_refusal

MAX_BODY_BYTES = 64 * 1024
ROUTE = "/v1/namespaces/{namespace}/finetunejobs/{name}/progress"
StatusWriter = Callable[[str, str, dict[str, Any]], Awaitable[object | None]]  # (ns, name, status) -> None: gone
log = logging.getLogger(__name__)


def _answer(status: int, reason: Reason | None = None, message: str | None = None) -> web.Response:
    """The JSON answer; a refusal is counted by reason and closes the connection."""
    result = RESULTS.get(status, "error")
    metrics.PROGRESS_PUSHES.labels(result).inc()
    if reason is not None:
        metrics.PROGRESS_REJECTED.labels(reason).inc()
    text = message or (ANSWERS[reason][1] if reason else "ok")
    response = web.json_response({"result": result, "reason": reason or "ok", "message": text}, status=status)
    if reason is not None:
        response.force_close()  # an early answer leaves the body unread: don't keep the connection
    return response


def refusal(reason: Reason, message: str | None = None) -> web.Response:
    return _answer(ANSWERS[reason][0], reason, message)


async def _and_hang_up(request: web.Request, response: web.Response) -> web.Response:
    """Send `response`, then close the connection at once: a client this slow gets no lingering time to
    finish its body (aiohttp otherwise keeps reading it for `LINGERING_SECONDS`)."""
    await response.prepare(request)
    await response.write_eof()
    if request.protocol is not None:
        request.protocol.force_close()
    return response


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _field_paths(exc: ValidationError) -> str:
    """Where a report failed, e.g. `progress.loss`; a caller's own key names are cut short and kept printable."""
    paths = []
    for error in exc.errors()[:5]:
        parts = [str(p) if isinstance(p, int) or (str(p).isascii() and str(p).isprintable()) else "?"
                 for p in error["loc"]]
        paths.append(".".join(p[:40] for p in parts) or "body")
    return ", ".join(paths)


def record_job_gauges(namespace: str, name: str, progress: Progress, attempt: int, written: object) -> None:
    """Set the job's `finetune_job_*` gauges from an accepted, written report; none for a job whose written
    status (the patch's answer) is already past training (a report that raced the end of the job)."""
    phase = ((written.get("status") or {}).get("phase")) if isinstance(written, Mapping) else None
    if phase in NOT_TRAINING_PHASES:
        metrics.JOB_SERIES.forget(namespace, name)
        return
    metrics.JOB_SERIES.record(
        namespace,
        name,
        attempt=attempt,
        loss=progress.loss,
        eval_loss=progress.eval_loss,
        tokens_per_second=progress.tokens_per_second,
        progress_ratio=progress.ratio(),
        eta_seconds=progress.eta_seconds,
    )


@web.middleware
async def never_a_traceback(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                            ) -> web.StreamResponse:
    """A bug answers a short JSON 500 (and is logged here), not aiohttp's error page."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("progress endpoint failed on %s", request.path)
        return refusal("internal")


def build_app(auth: Authenticator, limiter: RateLimiter, write_status: StatusWriter) -> web.Application:
    """The progress app; `client_max_size` makes aiohttp itself refuse bodies over MAX_BODY_BYTES."""

    async def post_progress(request: web.Request) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        if (request.content_length or 0) > MAX_BODY_BYTES:
            return refusal("too_large")
        decision = await auth.check(ns, name, _bearer(request), request.remote)
        if not decision.allowed or decision.facts is None:
            level = logging.DEBUG if decision.reason in QUIET else logging.INFO
            log.log(level, "progress push for %s/%s refused: %s", ns, name, decision.reason)
            return _answer(decision.status, decision.reason or "internal")
        if not limiter.allow((ns, name)):
            return refusal("job_rate")
        try:
            raw = await asyncio.wait_for(request.read(), BODY_TIMEOUT_SECONDS)
        except web.HTTPRequestEntityTooLarge:
            return refusal("too_large")
        except TimeoutError:
            return await _and_hang_up(request, refusal("body_timeout"))
        try:
            report = TrainerReport.model_validate_json(raw)
        except ValidationError as exc:
            return refusal("invalid_report", f"{ANSWERS['invalid_report'][1]} ({_field_paths(exc)})")
        if report.output is not None:
            why = output_refusal(report.output, decision.facts)
            if why is not None:
                return refusal(why)
        status: dict[str, Any] = {}
        if report.progress is not None:
            now = datetime.now(UTC).replace(microsecond=0)
            progress = report.progress.model_copy(update={"updated_at": now, "summary": report.progress.summary_text()})
            status["progress"] = progress.to_dict(exclude_none=True)
        if report.output is not None:
            status["output"] = report.output.to_dict(exclude_none=True)
        if status:
            try:
                written = await write_status(ns, name, status)
            except Exception as exc:  # API error, timeout, refused by the CRD schema: the trainer tries again
                log.warning("progress for %s/%s not written: %s: %.300s", ns, name, type(exc).__name__, exc)
                return refusal("status_write_failed")
            if written is None:
                metrics.JOB_SERIES.forget(ns, name)
                return refusal("job_gone")
            if report.progress is not None:
                record_job_gauges(ns, name, report.progress, decision.facts.attempt, written)
        log.debug(
            "progress for %s/%s from pod %s: step %s",
            ns,
            name,
            decision.pod,
            report.progress.step if report.progress else None,
        )
        return _answer(200)

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[never_a_traceback])
    app.router.add_post(ROUTE, post_progress)
    return app


def build_metrics_app() -> web.Application:
    """Plain-HTTP `/metrics` for Prometheus (separate port: scrapers rarely carry our CA)."""

    async def get_metrics(_: web.Request) -> web.Response:
        metrics.JOB_SERIES.expire()
        body = generate_latest(metrics.REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    return app
