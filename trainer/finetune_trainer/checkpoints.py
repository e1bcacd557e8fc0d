"""Complete checkpoints, resume, and checkpoint-on-SIGTERM.

A checkpoint counts only once `checkpoint-complete.json` exists in it. The marker is written by the global
main process after a barrier that follows the Trainer's save, so every rank's shards (ZeRO optimizer
partitions, RNG states) are on disk first; a process killed mid-save leaves a *torn* directory without it.
On start, torn directories are renamed to `torn-checkpoint-N` (outside the Trainer's `checkpoint-*` glob, so
rotation never counts them) and the run resumes from the newest complete one.

SIGTERM (pod eviction, `kubectl delete`) sets a flag; at the end of the current optimizer step all ranks agree
on it with one all-reduce, the Trainer saves a checkpoint and training stops, and `__main__` exits retryable.
Agreeing matters: ranks that save at different steps deadlock in ZeRO-3's collective gather. Unlike
transformers' `enable_jit_checkpoint` (per-rank timer, no agreement), this is safe under DeepSpeed. The pod's
grace period (torchrun gives workers 30 s after its own SIGTERM) must cover one step plus one save.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger(__name__)

MARKER = "checkpoint-complete.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every `checkpoint-N` directory, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return sorted(found)


def is_complete(path: Path) -> bool:
    """True once the completion marker is in place."""
    return (path / MARKER).is_file()


def set_aside_torn(root: Path) -> list[Path]:
    """Rename checkpoints without a marker so neither resume nor rotation picks them; main process only."""
    moved = []
    for step, path in _checkpoints(root):
        if not is_complete(path):
            target = root / f"torn-checkpoint-{step}-{int(time.time())}"
            path.rename(target)
            log.warning("checkpoint %s has no completion marker (torn save); moved to %s", path.name, target.name)
            moved.append(target)
    return moved


def newest_complete(root: Path) -> Path | None:
    """The checkpoint to resume from, or None for a fresh start."""
    complete = [path for _, path in _checkpoints(root) if is_complete(path)]
    return complete[-1] if complete else None


def write_marker(path: Path, step: int) -> None:
    """Atomically write the marker (temp file, fsync, rename) so the marker itself is never torn."""
    tmp = path / f".{MARKER}.tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "completedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / MARKER)
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class CompletionMarker(TrainerCallback):
    """After every save: wait for all ranks, then mark the checkpoint complete from the main process."""

    def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        _barrier()
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and path.is_dir():
            write_marker(path, state.global_step)
            log.info("checkpoint %s complete", path.name)


class SaveOnSigterm(TrainerCallback):
    """SIGTERM → every rank saves at the same step boundary, then training stops."""

    def __init__(self) -> None:
        self.requested = False
        self.stopped = False

    def _handler(self, signum: int, _frame: Any) -> None:
        self.requested = True

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        signal.signal(signal.SIGTERM, self._handler)

    def _anyone_requested(self, args: Any) -> bool:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0], device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if not self.stopped and self._anyone_requested(args):
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True
            if state.is_world_process_zero:
                log.warning("SIGTERM: saving a checkpoint at step %d, then stopping", state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def prepare_resume(root: Path, *, is_main: bool) -> Path | None:
    """Set torn checkpoints aside (main), wait for that, then pick the newest complete one (every rank)."""
    if is_main:
        set_aside_torn(root)
        for old in sorted(root.glob("torn-checkpoint-*"))[:-2]:  # keep the two newest for post-mortems
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return newest_complete(root)
