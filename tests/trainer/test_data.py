"""Rows → input_ids: text or chat rendered with the chosen template, and PEFT's special-token switches."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_api.trainer_input import TrainerInput
from tests.trainer.launching import write_config

pytestmark = pytest.mark.trainer


def tokenized(tmp_path: Path, trainer_env: dict[str, str], **data: object) -> tuple[list[int], object]:
    from transformers import AutoTokenizer

    from finetune_trainer import builtin
    from finetune_trainer.data import load_data
    from finetune_trainer.templates import install_chat_template

    cfg = TrainerInput.model_validate_json(write_config(tmp_path, dataset=dict(data)).read_text())
    tokenizer = AutoTokenizer.from_pretrained(builtin.resolve_model(builtin.TINY_LLAMA))
    install_chat_template(tokenizer, cfg.dataset.chat_template_format)
    train, _ = load_data(cfg, builtin.resolve_dataset(builtin.TINY_CHAT), tokenizer)
    return list(train[0]["input_ids"]), tokenizer


@pytest.fixture(autouse=True)
def _env(trainer_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FTJOB_CACHE", trainer_env["FTJOB_CACHE"])
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))


@pytest.mark.parametrize(
    ("data", "starts", "ends"),
    [
        ({"chatTemplateFormat": "none"}, "Question: What is", "."),
        ({"chatTemplateFormat": "chatml"}, "<|im_start|>user\nWhat is", "<|im_end|>\n"),
        ({"chatTemplateFormat": "zephyr"}, "<|user|>\nWhat is", "</s>\n"),
        ({"chatTemplateFormat": "none", "addSpecialTokens": True}, "<s>Question:", "."),
        ({"chatTemplateFormat": "none", "appendConcatToken": True}, "Question:", ".</s>"),
    ],
    ids=[
        "plain text field is used as is",
        "chatml renders the messages column",
        "zephyr renders the messages column",
        "addSpecialTokens adds the BOS token",
        "appendConcatToken appends EOS between documents",
    ],
)
def test_rows_become_the_expected_text(
    tmp_path: Path, trainer_env: dict[str, str], data: dict[str, object], starts: str, ends: str
) -> None:
    ids, tokenizer = tokenized(tmp_path, trainer_env, **data)
    text = tokenizer.decode(ids)  # type: ignore[attr-defined]
    assert text.startswith(starts) and text.endswith(ends), text
