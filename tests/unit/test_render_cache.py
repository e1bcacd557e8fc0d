"""RenderCache: one rendering per (uid, generation, labels, options), bounded, errors cached too."""

from dataclasses import replace
from typing import Any

from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render import Rendered, RenderOptions, render_all
from finetune_operator.render.cache import RenderCache
from tests.builders import job_body

OPTIONS = RenderOptions(image="trainer:test")


def ftj(
    uid: str | None = "u1", generation: int = 1, labels: dict[str, str] | None = None, **body_args: Any
) -> FineTuneJob:
    body = job_body(name="demo", nodes=2, gpus=8, **body_args)
    body["metadata"].update(uid=uid, generation=generation, labels=labels or {})
    return FineTuneJob.from_body(body)


def test_the_same_job_and_options_render_once_and_equal_render_all() -> None:
    cache = RenderCache()
    first = cache(ftj(), OPTIONS)
    assert cache(ftj(), OPTIONS) is first
    assert (cache.misses, cache.hits) == (1, 1)
    assert isinstance(first, Rendered)
    assert first.files == render_all(ftj(), OPTIONS).files
    assert first.job == render_all(ftj(), OPTIONS).job


def test_a_new_generation_labels_uid_or_options_render_again() -> None:
    cache = RenderCache()
    cache(ftj(), OPTIONS)
    variants = [
        (ftj(generation=2), OPTIONS),
        (ftj(labels={"kueue.x-k8s.io/queue-name": "q"}), OPTIONS),
        (ftj(uid="u2"), OPTIONS),
        (ftj(), replace(OPTIONS, attempt=2)),
        (ftj(), replace(OPTIONS, image="trainer:other")),
    ]
    for job, options in variants:
        cache(job, options)
    assert (cache.misses, cache.hits) == (6, 0)
    kueue = cache(ftj(labels={"kueue.x-k8s.io/queue-name": "q"}), OPTIONS)
    assert isinstance(kueue, Rendered) and kueue.job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"


def test_jobs_without_identity_are_never_cached() -> None:
    cache = RenderCache()
    cache(ftj(uid=None), OPTIONS)
    cache(ftj(uid=None), OPTIONS)
    assert (cache.misses, cache.hits) == (0, 0)


def test_an_invalid_spec_is_cached_as_its_error() -> None:
    cache = RenderCache()
    bad = ftj(overrides={"zero_optimization": {"stage": 2}})  # owned by spec.distributed.deepspeed.zeroStage
    error = cache(bad, OPTIONS)
    assert isinstance(error, InvalidSpecError)
    assert cache(bad, OPTIONS) is error


def test_the_least_recently_used_entry_goes_first() -> None:
    cache = RenderCache(size=2)
    a, b, c = ftj(uid="a"), ftj(uid="b"), ftj(uid="c")
    cache(a, OPTIONS)
    cache(b, OPTIONS)
    cache(a, OPTIONS)  # a is now the most recent
    cache(c, OPTIONS)  # evicts b
    cache(a, OPTIONS)
    cache(b, OPTIONS)
    assert (cache.misses, cache.hits) == (4, 2)
