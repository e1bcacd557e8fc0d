"""Library versions the trainer refuses to train under, each with the reason that was measured.

The image pins its versions (pyproject.toml); this guards jobs that bring their own image.
"""

from __future__ import annotations

from packaging.version import Version

# transformers < 5.24 checkpointed a decoder layer's `__call__`, so DeepSpeed ZeRO-3's module hooks ran again in
# the backward recompute and no gathered layer was ever released: each GPU ends up holding the whole model
# (bench/README.md, run 5: peak +1.6 GiB per 70B-wide layer on 5.17, +0.8 GiB = its shard on 5.24; the seed
# recipe's 70B job runs out of memory on 4 x H200 that way).
ZERO3_RELEASES_GATHERED_LAYERS = (5, 24)


def zero3_checkpointing_problem(transformers_version: str, *, zero3: bool, checkpointing: bool) -> str | None:
    """Why this combination would gather the whole model on every GPU, or None when it is safe."""
    if not (zero3 and checkpointing) or Version(transformers_version).release[:2] >= ZERO3_RELEASES_GATHERED_LAYERS:
        return None
    need = ".".join(map(str, ZERO3_RELEASES_GATHERED_LAYERS))
    return (
        f"transformers {transformers_version} never releases the layers DeepSpeed ZeRO-3 gathers when activation "
        f"checkpointing is on (every GPU ends up holding the whole model); use an image with transformers >= {need}, "
        "or set training.gradientCheckpointing: false"
    )
