"""CUDA caching allocator: expandable segments, unless the pod's own env configures the allocator.

Without them PyTorch keeps every block it ever reserved as a separate segment, and a segment can be returned only
when nothing in it is allocated; ZeRO-3's gather/release cycle (whole layers gathered, used, freed, in changing
sizes) leaves memory reserved that no later request fits. Expandable segments map memory into one growing
virtual range per stream instead (PyTorch's `expandable_segments:True`). Measured on the 70B QLoRA + ZeRO-3 job:
bench/README.md ("70B with our trainer").

Set at run time before the first CUDA allocation (`torch.cuda.memory._set_allocator_settings`, the setter behind
`PYTORCH_CUDA_ALLOC_CONF`) and exported for child processes. `PYTORCH_CUDA_ALLOC_CONF` or `PYTORCH_ALLOC_CONF` in
the environment (e.g. from `spec.template.env`) wins, including an explicit `expandable_segments:False`.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

SETTING = "expandable_segments:True"
ENV_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def use_expandable_segments() -> bool:
    """Turn expandable segments on for this process and its children; False when the env decides or no CUDA."""
    if any(os.environ.get(name) for name in ENV_NAMES):
        return False
    import torch

    if not torch.cuda.is_available():
        return False
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = SETTING
    torch.cuda.memory._set_allocator_settings(SETTING)
    log.debug("CUDA allocator: %s", SETTING)
    return True
