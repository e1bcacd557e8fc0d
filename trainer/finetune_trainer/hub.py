"""Push the adapter (with its model card) to the Hugging Face Hub, following `output.hub.strategy`.

Only the main process pushes. The token comes from `$HF_TOKEN` and nowhere else; without it, or without a
hub block, the adapter stays in `output.adapterDir` and the log says so. The final push is retried with
exponential backoff, then fails loudly with `PushFailedError` (a retryable exit: the checkpoint is complete,
so the next attempt resumes at the end and only pushes again). Pushes on save (`every_save`, `checkpoint`,
`all_checkpoints`) are best effort: a failure there is logged and training goes on.
`output.hub.endpoint` points the real `huggingface_hub` client at another server (tests use a local one).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from finetune_api.constants import ENV_HF_TOKEN
from finetune_api.trainer_input import TrainerInput
from finetune_api.v1alpha1.spec import HubTarget
from finetune_api.v1alpha1.status import OutputStatus
from finetune_trainer.errors import PushFailedError

log = logging.getLogger(__name__)

ADAPTER_FILES = ["adapter_model.safetensors", "adapter_config.json"]


def hub_target(cfg: TrainerInput) -> tuple[HubTarget, str] | None:
    """(hub config, token) when a push is configured and possible; logs why not otherwise."""
    hub = cfg.output.hub
    if hub is None:
        log.info("no output.hub configured; the adapter stays in %s", cfg.output.adapter_dir)
        return None
    token = os.environ.get(ENV_HF_TOKEN)
    if not token:
        log.warning(
            "output.hub.repoId %s set but %s is empty; the adapter stays in %s",
            hub.repo_id,
            ENV_HF_TOKEN,
            cfg.output.adapter_dir,
        )
        return None
    return hub, token


def _upload(
    hub: HubTarget,
    token: str,
    folder: Path,
    *,
    path_in_repo: str | None,
    message: str,
    allow: list[str] | None,
) -> Any:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint, token=token)
    api.create_repo(hub.repo_id, private=hub.private, exist_ok=True)
    return api.upload_folder(
        repo_id=hub.repo_id,
        folder_path=str(folder),
        path_in_repo=path_in_repo,
        commit_message=message,
        allow_patterns=allow,
    )


def push(
    hub: HubTarget,
    token: str,
    folder: Path,
    *,
    message: str,
    path_in_repo: str | None = None,
    allow: list[str] | None = None,
    attempts: int = 4,
    backoff: float = 2.0,
) -> OutputStatus:
    """Upload a folder as one commit, backing off exponentially; PushFailedError after the last try."""
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            info = _upload(hub, token, folder, path_in_repo=path_in_repo, message=message, allow=allow)
            log.info("pushed %s to %s (commit %s)", folder, hub.repo_id, info.oid)
            return OutputStatus(hub_repo=hub.repo_id, revision=info.oid, url=info.commit_url)
        except Exception as e:  # network, 5xx, auth: all retried, then reported
            last = e
            first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
            log.warning("push to %s failed (attempt %d/%d): %s", hub.repo_id, attempt, attempts, first_line)
            if attempt < attempts:
                time.sleep(backoff * 2 ** (attempt - 1))
    endpoint = hub.endpoint or "https://huggingface.co"
    raise PushFailedError(
        f"pushing the adapter to {hub.repo_id} at {endpoint} failed after {attempts} attempts: {last}"
    ) from last


class PushOnSave(TrainerCallback):
    """every_save: adapter to the root; checkpoint: + last-checkpoint/; all_checkpoints: checkpoint-N/."""

    def __init__(self, hub: HubTarget, token: str) -> None:
        self.hub = hub
        self.token = token

    def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if not state.is_world_process_zero or self.hub.strategy == "end":
            return
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        message = f"checkpoint at step {state.global_step}"
        try:
            push(self.hub, self.token, ckpt, message=message, allow=ADAPTER_FILES, attempts=2, backoff=1.0)
            if self.hub.strategy == "checkpoint":
                push(self.hub, self.token, ckpt, message=message, path_in_repo="last-checkpoint", attempts=2)
            elif self.hub.strategy == "all_checkpoints":
                push(self.hub, self.token, ckpt, message=message, path_in_repo=ckpt.name, attempts=2)
        except PushFailedError as e:
            log.warning("push on save skipped (the final push will retry): %s", e)
