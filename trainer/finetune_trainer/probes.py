"""Logits of the final model on a fixed probe text, so a test can prove the saved adapter reproduces them.

Written only when `output.probePath` is set. Under ZeRO-3 the forward pass is collective (parameters are
gathered layer by layer), so every rank runs it and only the main process writes the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROBE_TEXT = "Question: What is 3 plus 4?\nAnswer: 3 plus 4 is 7."


def write_probe(model: Any, tokenizer: Any, path: Path, *, device: Any, is_main: bool) -> None:
    """Save `input_ids` and fp32 `logits` (eval mode: no dropout) as safetensors."""
    import torch
    from safetensors.torch import save_file

    input_ids = tokenizer(PROBE_TEXT, return_tensors="pt", add_special_tokens=False)["input_ids"]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=input_ids.to(device)).logits.float().cpu()
    model.train(was_training)
    if is_main:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"input_ids": input_ids.contiguous(), "logits": logits.contiguous()}, str(path))
