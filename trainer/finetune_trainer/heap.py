"""Python's garbage collector during training: the setup heap is frozen so full collections stay short.

By the first optimizer step the process holds millions of long-lived Python objects: torch, transformers, TRL,
datasets, the model's modules and, with torch.compile, dynamo's and inductor's graphs. The collector's oldest
generation is scanned whole whenever enough new objects have survived, which in a training loop happens rarely
and at no predictable step; each such scan walks the whole heap while the GPU waits for the next kernels, a step
that takes seconds instead of a fraction of one. `gc.freeze()` moves every object alive at that moment into the
permanent generation, which collections skip: later full collections only walk what training itself keeps
creating. The collector stays on (reference cycles made during training are still freed); what is frozen is the
setup, never freed again, which it would not have been anyway.

`FreezeSetupHeap` freezes at the start of training and again after each of the first `FREEZE_STEPS` steps (the
first steps compile the model and build the optimizer's state). Megatron-LM turns automatic collection off and
collects every N steps instead (`--manual-gc`) for the same stalls; freezing keeps Python's own schedule.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger(__name__)

FREEZE_STEPS = 3
"""Steps after which the heap is frozen again: compilation (step 1, and a recompile once shapes change) and the
optimizer's first step (its state) create most of what the rest of the run keeps."""


def freeze_heap() -> int:
    """Collect the young generations, then freeze everything alive; returns how many objects are frozen now."""
    gc.collect(1)
    gc.freeze()
    return gc.get_freeze_count()


class FreezeSetupHeap(TrainerCallback):
    """Freeze the heap when training starts and after its first `FREEZE_STEPS` steps (module docstring)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        log.debug("gc: %d objects frozen at the start of training", freeze_heap())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step <= FREEZE_STEPS:
            log.debug("gc: %d objects frozen after step %d", freeze_heap(), state.global_step)
