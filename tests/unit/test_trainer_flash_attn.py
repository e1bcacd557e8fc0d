"""A job asking for flash_attention_2 where flash-attn cannot run gets the documented sdpa fallback, decided before
the model loads, with a log line naming the fix; never an error from inside transformers' from_pretrained.

The default trainer image has no flash_attn package (only the Dockerfile's trainer-flash-attn target compiles it),
so this is the path every such job takes there. The "installed" and "broken" cases put a real package named
flash_attn on sys.path.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from finetune_api.trainer_input import TrainerInput
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render import render_all
from finetune_trainer.model import attn_implementation, load_model, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None


def trainer_config(attn: str) -> TrainerInput:
    """The tiny CPU example's trainer.json, as the operator renders it, with the attention asked for."""
    body = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    body["spec"]["model"]["attnImplementation"] = attn
    return render_all(FineTuneJob.from_body(body)).trainer


@pytest.fixture
def flash_attn_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path where a test writes flash_attn/__init__.py; the module is forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "flash_attn").mkdir()
    yield tmp_path / "flash_attn" / "__init__.py"
    sys.modules.pop("flash_attn", None)


def test_without_cuda_flash_attention_2_falls_back_to_sdpa(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="finetune_trainer.model"):
        assert attn_implementation(trainer_config("flash_attention_2"), cuda=False) == "sdpa"
    assert "flash_attention_2 unavailable (no CUDA device); using sdpa" in caplog.text


@pytest.mark.skipif(HAS_FLASH_ATTN, reason="flash_attn is installed here; the missing-package case needs it absent")
def test_missing_flash_attn_falls_back_to_sdpa_and_names_the_image_fix(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="finetune_trainer.model"):
        assert attn_implementation(trainer_config("flash_attention_2"), cuda=True) == "sdpa"
    assert "the flash_attn package is not installed in this image" in caplog.text
    assert "trainer-flash-attn" in caplog.text and "FTJOB_FLASH_ATTN=1" in caplog.text


def test_a_flash_attn_that_does_not_import_falls_back_with_its_error(
    flash_attn_package: Path, caplog: pytest.LogCaptureFixture
) -> None:
    flash_attn_package.write_text(
        "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')\n"
    )
    sys.modules.pop("flash_attn", None)
    with caplog.at_level(logging.WARNING, logger="finetune_trainer.model"):
        assert attn_implementation(trainer_config("flash_attention_2"), cuda=True) == "sdpa"
    assert "flash_attn does not import (flash_attn_2_cuda.so: undefined symbol" in caplog.text
    assert "trainer-flash-attn" in caplog.text


def test_an_importable_flash_attn_on_cuda_is_used(flash_attn_package: Path, caplog: pytest.LogCaptureFixture) -> None:
    flash_attn_package.write_text("__version__ = '2.8.3.post2'\n")
    sys.modules.pop("flash_attn", None)
    with caplog.at_level(logging.WARNING, logger="finetune_trainer.model"):
        assert attn_implementation(trainer_config("flash_attention_2"), cuda=True) == "flash_attention_2"
    assert "unavailable" not in caplog.text


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_other_implementations_pass_through_untouched(attn: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="finetune_trainer.model"):
        assert attn_implementation(trainer_config(attn), cuda=False) == attn
        assert attn_implementation(trainer_config(attn), cuda=True) == attn
    assert caplog.text == ""


def test_the_tiny_model_loads_with_sdpa_when_flash_attention_2_was_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole load path on CPU: from_pretrained gets sdpa, so transformers never sees flash_attention_2."""
    monkeypatch.setenv("FTJOB_CACHE", str(tmp_path))
    from finetune_trainer.builtin import TINY_LLAMA, resolve_model

    cfg = trainer_config("flash_attention_2")
    path = resolve_model(TINY_LLAMA)
    model = load_model(cfg, path, load_tokenizer(cfg, path), cuda=False, zero3=False)
    assert model.config._attn_implementation == "sdpa"
