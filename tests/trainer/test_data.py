"""Rows → input_ids: text or chat rendered with the chosen template, and PEFT's special-token switches."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_api.trainer_input import TrainerConfig
from tests.trainer.launching import write_config

pytestmark = pytest.mark.trainer


def tokenized(tmp_path: Path, trainer_env: dict[str, str], **data: object) -> tuple[list[int], object]:
    from transformers import AutoTokenizer

    from finetune_trainer import builtin
    from finetune_trainer.data import load_data
    from finetune_trainer.templates import install_chat_template

    cfg = TrainerConfig.model_validate_json(write_config(tmp_path, data=dict(data)).read_text())
    tokenizer = AutoTokenizer.from_pretrained(builtin.resolve_model(builtin.TINY_LLAMA))
    install_chat_template(tokenizer, cfg.data.chat_template_format)
    train, _ = load_data(cfg, builtin.resolve_dataset(builtin.TINY_CHAT), tokenizer)
    return list(train[0]["input_ids"]), tokenizer


@pytest.fixture(autouse=True)
def _env(trainer_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FTJOB_CACHE", trainer_env["FTJOB_CACHE"])
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))


@pytest.mark.parametrize(
    ("data", "starts", "ends"),
    [
        ({"chat_template_format": "none"}, "Question: What is", "."),
        ({"chat_template_format": "chatml"}, "<|im_start|>user\nWhat is", "<|im_end|>\n"),
        ({"chat_template_format": "zephyr"}, "<|user|>\nWhat is", "</s>\n"),
        ({"chat_template_format": "none", "add_special_tokens": True}, "<s>Question:", "."),
        ({"chat_template_format": "none", "append_concat_token": True}, "Question:", ".</s>"),
    ],
    ids=[
        "plain text field is used as is",
        "chatml renders the messages column",
        "zephyr renders the messages column",
        "add_special_tokens adds the BOS token",
        "append_concat_token appends EOS between documents",
    ],
)
def test_rows_become_the_expected_text(
    tmp_path: Path, trainer_env: dict[str, str], data: dict[str, object], starts: str, ends: str
) -> None:
    ids, tokenizer = tokenized(tmp_path, trainer_env, **data)
    text = tokenizer.decode(ids)  # type: ignore[attr-defined]
    assert text.startswith(starts) and text.endswith(ends), text
