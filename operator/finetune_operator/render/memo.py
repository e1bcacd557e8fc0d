"""A bounded memo of `render`, for the operator's reconcile rounds.

A job is reconciled on every event of its children (Job created, pods scheduled, ready, ...), and each active
round renders the job to compare what should exist with what does. Rendering is most of a round's CPU (the YAML
of accelerate.yaml alone is three quarters of it: about 1 ms against 0.1 ms for the rest of a steady round), yet
its output changes only with the job's uid (owner of the children), its spec (`metadata.generation`), its labels
(a Kueue queue label reaches the Job), the attempt and the render options (image, progress URL, pod policy).
Those are the key; the admission is not, since it is itself a function of uid, generation and policy
(`finetune_operator.admit`). Entries are shared, so callers must not mutate what they get (`reconcile` builds new
dicts around them).
"""

from dataclasses import dataclass

from finetune_operator.memo import Memo
from finetune_operator.render import Rendered, RenderOptions, render
from finetune_operator.render.context import RenderContext

MemoKey = tuple[str, int, tuple[tuple[str, str], ...], int, RenderOptions]
DEFAULT_SIZE = 256
"""A burst creates a few jobs per second and each job's rounds come within seconds of each other: 256 renderings
(a few MB) cover that without growing with the number of jobs."""


@dataclass
class RenderMemo(Memo[MemoKey, Rendered]):
    """Least-recently-used renderings by job identity, attempt and options; a drop-in `renderer` for `reconcile`."""

    size: int = DEFAULT_SIZE

    def __call__(self, ctx: RenderContext) -> Rendered:
        meta = ctx.job.metadata
        if not meta.uid or meta.generation is None:  # not from an API server: nothing identifies the spec
            return render(ctx)
        key: MemoKey = (meta.uid, meta.generation, tuple(sorted(meta.labels.items())), ctx.attempt, ctx.options)
        return self.get_or_compute(key, lambda: render(ctx))
