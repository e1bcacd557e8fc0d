"""The aiohttp app: `POST /v1/namespaces/{ns}/finetunejobs/{name}/progress` and `GET /metrics`.

Order of checks: size (413), bearer token (401/403 via `auth`), rate (429), body (400), then a
status patch of `progress` and `output` only. The status writer is injected, so the app is
unit-tested with fakes. Responses carry a short reason, never the token or the body.
"""

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from finetune_api.v1alpha1.status import TrainerReport
from finetune_operator import metrics
from finetune_operator.progress.auth import Authenticator
from finetune_operator.progress.ratelimit import RateLimiter

MAX_BODY_BYTES = 64 * 1024
ROUTE = "/v1/namespaces/{namespace}/finetunejobs/{name}/progress"
StatusWriter = Callable[[str, str, dict[str, Any]], Awaitable[object | None]]  # (ns, name, status) -> None: gone
log = logging.getLogger(__name__)


def _answer(status: int, result: str, reason: str) -> web.Response:
    metrics.PROGRESS_PUSHES.labels(result).inc()
    return web.json_response({"result": result, "reason": reason}, status=status)


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def build_app(auth: Authenticator, limiter: RateLimiter, write_status: StatusWriter) -> web.Application:
    """The progress app; `client_max_size` makes aiohttp itself answer 413 on big bodies."""

    async def post_progress(request: web.Request) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        if (request.content_length or 0) > MAX_BODY_BYTES:
            return _answer(413, "too_large", f"body over {MAX_BODY_BYTES} bytes")
        decision = await auth.check(ns, name, _bearer(request))
        if not decision.allowed:
            log.info("progress push for %s/%s refused: %s", ns, name, decision.reason)
            return _answer(decision.status, "unauthorized" if decision.status == 401 else "forbidden", decision.reason)
        if not limiter.allow((ns, name)):
            return _answer(429, "rate_limited", "too many reports; at most one per second")
        try:
            raw = await request.read()
            report = TrainerReport.model_validate_json(raw)
        except web.HTTPRequestEntityTooLarge:
            return _answer(413, "too_large", f"body over {MAX_BODY_BYTES} bytes")
        except ValidationError as exc:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors()[:5])
            return _answer(400, "invalid", f"not a TrainerReport ({fields})")
        status: dict[str, Any] = {}
        if report.progress is not None:
            progress = report.progress.model_copy(update={"updated_at": datetime.now(UTC).replace(microsecond=0)})
            status["progress"] = progress.to_dict(exclude_none=True)
        if report.output is not None:
            status["output"] = report.output.to_dict(exclude_none=True)
        if status and await write_status(ns, name, status) is None:
            return _answer(404, "not_found", "no such FineTuneJob")
        log.debug(
            "progress for %s/%s from pod %s: step %s",
            ns,
            name,
            decision.pod,
            report.progress.step if report.progress else None,
        )
        return _answer(200, "accepted", "ok")

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(ROUTE, post_progress)
    return app


def build_metrics_app() -> web.Application:
    """Plain-HTTP `/metrics` for Prometheus (separate port: scrapers rarely carry our CA)."""

    async def get_metrics(_: web.Request) -> web.Response:
        body = generate_latest(metrics.REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    return app
