"""finetune_trainer.allocator: expandable segments on CUDA unless the environment configures the allocator."""

import pytest

torch = pytest.importorskip("torch")

from finetune_trainer import allocator  # noqa: E402


@pytest.fixture
def cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", calls.append)
    for name in allocator.ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    return calls


def test_on_by_default_with_cuda(cuda, monkeypatch):
    assert allocator.use_expandable_segments() is True
    assert cuda == ["expandable_segments:True"]
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"  # for child processes


@pytest.mark.parametrize("name", allocator.ENV_NAMES)
def test_the_environment_wins(cuda, monkeypatch, name):
    monkeypatch.setenv(name, "expandable_segments:False")
    assert allocator.use_expandable_segments() is False
    assert cuda == []


def test_nothing_without_cuda(cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert allocator.use_expandable_segments() is False
    assert cuda == []
