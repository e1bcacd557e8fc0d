"""A bounded memo of `render_or_errors`, for the operator's reconcile loop.

A job is reconciled on every event of its children (Job created, pods scheduled, ready, ...), and
rendering was 13% of the operator's CPU in a 100-job burst, yet its output only changes with the
job's spec (its generation), its labels (the Kueue queue label reaches the Job), its uid (owner of
the children) and the render options (attempt, image, progress URL, pod policy). Those are the key. Entries
are shared, so callers must not mutate what they get (`reconcile` builds new dicts around them).
"""

from collections import OrderedDict
from dataclasses import dataclass, field

from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render import Rendered, RenderOptions, render_or_errors

CacheKey = tuple[str, int, tuple[tuple[str, str], ...], RenderOptions]
# A burst creates a few jobs per second and each job's rounds come within seconds of each other;
# 256 renderings (a few MB) cover that without growing with the number of jobs.
DEFAULT_SIZE = 256


@dataclass
class RenderCache:
    """Least-recently-used renderings (or their InvalidSpecError) by job identity and options."""

    size: int = DEFAULT_SIZE
    hits: int = 0
    misses: int = 0
    _entries: "OrderedDict[CacheKey, Rendered | InvalidSpecError]" = field(default_factory=OrderedDict)

    def __call__(self, job: FineTuneJob, options: RenderOptions) -> Rendered | InvalidSpecError:
        meta = job.metadata
        if not meta.uid or meta.generation is None:  # not from an API server: nothing identifies the spec
            return render_or_errors(job, options)
        key: CacheKey = (meta.uid, meta.generation, tuple(sorted(meta.labels.items())), options)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        rendered = render_or_errors(job, options)
        self._entries[key] = rendered
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return rendered
