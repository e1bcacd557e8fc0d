"""Pushing the adapter with the real `huggingface_hub` client to a local fake Hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_api.trainer_input import TrainerInput
from finetune_api.v1alpha1.spec import HubTarget
from finetune_trainer.cards import write_card
from finetune_trainer.errors import PushFailedError
from finetune_trainer.hub import push
from tests.fixtures.hub_server import HubServer
from tests.trainer.launching import write_config

pytestmark = pytest.mark.trainer

TOKEN = "hf_test_token_never_logged"


def adapter_folder(tmp_path: Path, hub: HubServer) -> tuple[Path, TrainerInput]:
    """A small adapter directory with its card, as the trainer leaves it before pushing."""
    config = write_config(tmp_path, output={"hub": {"repoId": "org/tiny-lora", "endpoint": hub.endpoint}})
    cfg = TrainerInput.model_validate_json(config.read_text())
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * 4096)
    history = [{"step": s, "loss": 7.0 - s * 0.4} for s in range(1, 11)] + [{"step": 10, "eval_loss": 3.1}]
    write_card(cfg, folder, {"train_loss": 4.2, "eval_loss": 3.1}, history)
    return folder, cfg


def test_push_commits_adapter_config_card_and_plot(tmp_path: Path) -> None:
    with HubServer() as hub:
        folder, cfg = adapter_folder(tmp_path, hub)
        assert cfg.output.hub is not None
        status = push(cfg.output.hub, TOKEN, folder, message="tiny: adapter after step 10")
        repo = hub.repos["org/tiny-lora"]
        assert set(repo.files) == {"adapter_config.json", "adapter_model.safetensors", "README.md", "loss.png"}
        assert repo.files["loss.png"].startswith(b"\x89PNG")
        card = repo.files["README.md"].decode()
        assert "library_name: peft" in card and "| train_loss | 4.2 |" in card and "![loss curve](loss.png)" in card
        assert '"repoId": "org/tiny-lora"' in card  # the job's config travels with the adapter
        assert TOKEN not in card
        assert set(hub.auth_headers) == {f"Bearer {TOKEN}"}
        assert repo.private is True and repo.commits == ["tiny: adapter after step 10"]
        assert status.hub_repo == "org/tiny-lora" and status.url and status.revision in status.url


def test_failing_push_is_retried_then_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with HubServer() as hub:
        folder, _ = adapter_folder(tmp_path, hub)
        hub.fail_next(1000)
        target = HubTarget(repo_id="org/tiny-lora", endpoint=hub.endpoint)
        with pytest.raises(PushFailedError, match=r"org/tiny-lora at http://127\.0\.0\.1:\d+ failed after 3 attempts"):
            push(target, TOKEN, folder, message="final", attempts=3, backoff=0.01)
        assert [path for _, path in hub.requests] == ["/api/repos/create"] * 3
        assert caplog.text.count("push to org/tiny-lora failed") == 3
        assert TOKEN not in caplog.text


def test_push_recovers_when_the_hub_comes_back(tmp_path: Path) -> None:
    with HubServer() as hub:
        folder, _ = adapter_folder(tmp_path, hub)
        hub.fail_next(2)
        target = HubTarget(repo_id="org/tiny-lora", endpoint=hub.endpoint)
        push(target, TOKEN, folder, message="final", attempts=3, backoff=0.01)
        assert "adapter_model.safetensors" in hub.repos["org/tiny-lora"].files
