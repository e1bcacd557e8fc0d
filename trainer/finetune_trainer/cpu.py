"""CPU-only runs (laptops, CI): detection and the two DeepSpeed/accelerate quirks they need.

* `use_cpu=True` in the SFTConfig whenever there is no CUDA device: without it accelerate sees one process
  while DeepSpeed sees N and the batch-size check fails (research §2.4, §7).
* DeepSpeed's CPU accelerator JIT-compiles a shared-memory allreduce (`deepspeed_shm_comm`, C++20 against the
  torch headers) the first time its comm backend starts: minutes on a 2-core runner, a compiler in the
  image, and a hang if two ranks race for the build lock while the launcher dies. We skip it; gloo does the
  collectives. GPU runs are untouched.
"""

from __future__ import annotations

import logging
import os

from finetune_api.trainer_input import TrainerInput

log = logging.getLogger(__name__)


def on_cpu(cfg: TrainerInput) -> bool:
    """CPU when the config says so or when no CUDA device exists."""
    import torch

    return cfg.strategy.use_cpu or not torch.cuda.is_available()


def prepare_cpu_backend(cfg: TrainerInput) -> None:
    """Skip DeepSpeed's shared-memory op build on CPU (before anything initialises DeepSpeed's comm)."""
    if not on_cpu(cfg) or os.environ.get("DS_ACCELERATOR", "cpu") != "cpu":
        return
    import importlib

    try:
        # Not `import deepspeed.comm.torch as m`: `deepspeed.comm` re-exports the torch package under that name.
        ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
    except ImportError:  # DeepSpeed is optional for ZeRO stage 0
        return
    ds_torch_comm.build_shm_op = lambda: None  # type: ignore[attr-defined]
    log.debug("DeepSpeed shared-memory allreduce build skipped on CPU; using gloo")
