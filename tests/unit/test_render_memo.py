"""RenderMemo: one rendering per (uid, generation, labels, attempt, options), bounded, equal to `render`."""

from dataclasses import replace
from typing import Any

from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.admit import admit_or_raise
from finetune_operator.render import RenderContext, RenderOptions, render
from finetune_operator.render.memo import RenderMemo
from tests.builders import job_body

OPTIONS = RenderOptions(image="trainer:test")


def ctx(
    uid: str | None = "u1",
    generation: int = 1,
    labels: dict[str, str] | None = None,
    attempt: int = 1,
    options: RenderOptions = OPTIONS,
) -> RenderContext:
    body: dict[str, Any] = job_body(name="demo", nodes=2, gpus=8)
    body["metadata"].update(uid=uid, generation=generation, labels=labels or {})
    job = FineTuneJob.from_body(body)
    return RenderContext(job, admit_or_raise(job), attempt, options)


def test_the_same_context_renders_once_and_equals_render() -> None:
    memo = RenderMemo()
    first = memo(ctx())
    assert memo(ctx()) is first
    assert (memo.misses, memo.hits) == (1, 1)
    plain = render(ctx())
    assert (first.files, first.job, first.service) == (plain.files, plain.job, plain.service)


def test_a_new_generation_labels_uid_attempt_or_options_render_again() -> None:
    memo = RenderMemo()
    memo(ctx())
    for variant in (
        ctx(generation=2),
        ctx(labels={"kueue.x-k8s.io/queue-name": "q"}),
        ctx(uid="u2"),
        ctx(attempt=2),
        ctx(options=replace(OPTIONS, image="trainer:other")),
    ):
        memo(variant)
    assert (memo.misses, memo.hits) == (6, 0)
    second = memo(ctx(attempt=2))
    assert second.job["metadata"]["name"] == "demo-2"
    kueue = memo(ctx(labels={"kueue.x-k8s.io/queue-name": "q"}))
    assert kueue.job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"


def test_jobs_without_identity_are_never_memoized() -> None:
    memo = RenderMemo()
    memo(ctx(uid=None))
    memo(ctx(uid=None))
    assert (memo.misses, memo.hits) == (0, 0)


def test_the_least_recently_used_entry_goes_first() -> None:
    memo = RenderMemo(size=2)
    memo(ctx(uid="a"))
    memo(ctx(uid="b"))
    memo(ctx(uid="a"))  # a is now the most recent
    memo(ctx(uid="c"))  # evicts b
    memo(ctx(uid="a"))
    memo(ctx(uid="b"))
    assert (memo.misses, memo.hits) == (4, 2)
