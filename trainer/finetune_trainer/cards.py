"""The model card (README.md) and loss-curve PNG that travel with the adapter.

The card carries the job's trainer config (which holds no secret: tokens only ever come from the environment),
the final metrics and the loss plot, so a pushed adapter says how it was made. Rendering only; pushing is
`hub.py`'s job.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from finetune_api.trainer_input import TrainerInput

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def plot_loss(log_history: list[dict[str, Any]], path: Path) -> bool:
    """Training (and eval) loss against step as a PNG; False when nothing was logged."""
    train = [(h["step"], h["loss"]) for h in log_history if "loss" in h and "step" in h]
    evals = [(h["step"], h["eval_loss"]) for h in log_history if "eval_loss" in h and "step" in h]
    if not train and not evals:
        return False
    import matplotlib

    matplotlib.use("Agg")  # no display in a pod
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss")
    if evals:
        ax.plot(*zip(*evals, strict=True), marker="o", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def render_card(cfg: TrainerInput, metrics: dict[str, Any], *, has_plot: bool) -> str:
    """README.md text: Hub metadata, what was trained, final metrics, the plot and the full config."""
    base = cfg.model.name
    meta = [
        "---",
        "library_name: peft",
        "pipeline_tag: text-generation",
        "tags:",
        "- finetune-operator",
        "- trl",
        "- sft",
    ]
    meta.append(f"- {cfg.adapter.type}")
    if cfg.model.quantization is not None:
        meta.append("- qlora")
    if _HUB_ID.match(base):
        meta.append(f"base_model: {base}")
    meta.append("---")
    rows = "\n".join(f"| {k} | {_fmt(v)} |" for k, v in sorted(metrics.items()))
    config = cfg.to_json()
    parts = [
        "\n".join(meta),
        f"# {cfg.job.namespace}/{cfg.job.name}",
        f"LoRA adapter for `{base}` (revision `{cfg.model.revision}`), trained with TRL SFT on "
        f"`{cfg.dataset.name}` by finetune-operator.",
        "## Final metrics\n\n| metric | value |\n|---|---|\n" + rows if rows else "## Final metrics\n\nnone logged",
    ]
    if has_plot:
        parts.append("## Loss\n\n![loss curve](loss.png)")
    where = cfg.output.hub.repo_id if cfg.output.hub else "."
    parts.append(
        "## Usage\n\n```python\nfrom peft import AutoPeftModelForCausalLM\n"
        f"model = AutoPeftModelForCausalLM.from_pretrained({where!r})\n```"
    )
    parts.append(f"## Training configuration (trainer.json)\n\n```json\n{config}\n```")
    return "\n\n".join(parts) + "\n"


def write_card(cfg: TrainerInput, out_dir: Path, metrics: dict[str, Any], log_history: list[dict[str, Any]]) -> None:
    """Write README.md and loss.png into the adapter directory."""
    has_plot = plot_loss(log_history, out_dir / "loss.png")
    (out_dir / "README.md").write_text(render_card(cfg, metrics, has_plot=has_plot))


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
