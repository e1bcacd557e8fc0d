"""finetune_trainer.heap: the setup heap is frozen at the start of training and after the first steps only."""

import gc
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from finetune_trainer.heap import FREEZE_STEPS, FreezeSetupHeap


def test_the_heap_is_frozen_at_the_start_and_after_the_first_steps_only():
    callback = FreezeSetupHeap()
    state = SimpleNamespace(global_step=0)
    gc.unfreeze()
    try:
        callback.on_train_begin(None, state, None)
        at_start = gc.get_freeze_count()
        assert at_start > 0
        kept = [[index] for index in range(5000)]  # tracked containers made by "the first step"
        state.global_step = 1
        callback.on_step_end(None, state, None)
        assert gc.get_freeze_count() >= at_start + len(kept)
        gc.unfreeze()
        state.global_step = FREEZE_STEPS + 1
        callback.on_step_end(None, state, None)
        assert gc.get_freeze_count() == 0  # later steps leave the collector alone
    finally:
        gc.unfreeze()
