"""A round renders through the operator's `RenderMemo`: two rounds of one job (same uid, generation, labels,
attempt) render it once, as a burst's child events would otherwise re-render it each time."""

import asyncio
from typing import Any

import pytest

from finetune_operator.handlers import reconciling
from finetune_operator.handlers.state import OperatorConfig, OperatorState
from finetune_operator.render import memo
from tests.builders import job_body


class StopRoundError(Exception):
    """Ends the round after `reconcile` decided (no API server here)."""


def test_rounds_of_one_job_render_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    state = OperatorState(config=OperatorConfig(image="t"), kube=None)  # type: ignore[arg-type]
    body: dict[str, Any] = job_body(name="demo", namespace="ns")
    body["metadata"] |= {"uid": "u1", "generation": 1, "resourceVersion": "1"}
    state.bodies.offer(("ns", "demo"), body)
    renders = 0
    real_render = memo.render

    def counting(ctx: Any) -> Any:
        nonlocal renders
        renders += 1
        return real_render(ctx)

    async def stop(*_: Any) -> None:
        raise StopRoundError

    monkeypatch.setattr(memo, "render", counting)
    monkeypatch.setattr(reconciling, "_apply", stop)
    for _ in range(2):
        with pytest.raises(StopRoundError):
            asyncio.run(reconciling._reconcile_once(state, ("ns", "demo")))
    assert renders == 1 and state.renders.hits == 1
