"""`configure.tune_gc`: what exists at start is frozen out of the collector's walks, and the youngest generation
is collected less often; the older generations keep their ratios."""

import gc

from finetune_operator.handlers.configure import GC_YOUNG_THRESHOLD, tune_gc


def test_tune_gc_freezes_what_exists_and_raises_only_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        gc.unfreeze()
        tune_gc()
        assert gc.get_freeze_count() > 0  # this test process's modules, at least
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert before[0] < GC_YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
