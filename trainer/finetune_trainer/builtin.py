"""Built-in tiny model, tokenizer and dataset, generated locally so tests and laptops download nothing.

`builtin:tiny-llama` is a 2-layer Llama-architecture model (hidden 64) built from a `LlamaConfig` with a
byte-level BPE tokenizer trained on the same generated text; `builtin:tiny-chat` is a deterministic jsonl
dataset of templated arithmetic whose loss visibly drops within a few dozen LoRA steps. Both are made once
under `${FTJOB_CACHE:-~/.cache/finetune-operator}/builtin/` and reused: each is built in a temporary
directory and renamed into place, so concurrent processes (several ranks on one host) never see a half-written
copy. This module owns only generation and name resolution; loading is `model.py` / `data.py`'s job.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from finetune_api import constants
from finetune_trainer.templates import CHATML as CHATML_TEMPLATE

log = logging.getLogger(__name__)

PREFIX = "builtin:"
TINY_LLAMA = "builtin:tiny-llama"
TINY_CHAT = "builtin:tiny-chat"
TEXT_FIELD = "content"

SPECIAL_TOKENS = [
    "<s>",
    "</s>",
    "<pad>",
    "<|im_start|>",
    "<|im_end|>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
]
_OPS: tuple[tuple[str, Callable[[int, int], int]], ...] = (
    ("plus", lambda a, b: a + b),
    ("minus", lambda a, b: a - b),
    ("times", lambda a, b: a * b),
)


def cache_root() -> Path:
    """Where built-in artefacts live; FTJOB_CACHE lets tests isolate it."""
    base = os.environ.get(constants.ENV_CACHE) or str(Path.home() / ".cache" / "finetune-operator")
    return Path(base) / "builtin"


def is_builtin(name: str) -> bool:
    """True for names this module resolves."""
    return name.startswith(PREFIX)


def resolve_model(name: str) -> str:
    """Path of the built-in model directory (built on first use); non-builtin names pass through."""
    if not is_builtin(name):
        return name
    if name != TINY_LLAMA:
        from finetune_trainer.errors import UnknownModelError

        raise UnknownModelError(f"model.name: unknown built-in model {name!r}; the only one is {TINY_LLAMA!r}")
    return str(_build_once(cache_root() / "tiny-llama", _write_tiny_llama))


def resolve_dataset(name: str) -> str:
    """Path of the built-in dataset directory (built on first use); non-builtin names pass through."""
    if not is_builtin(name):
        return name
    if name != TINY_CHAT:
        from finetune_trainer.errors import BadDatasetError

        raise BadDatasetError(f"dataset.name: unknown built-in dataset {name!r}; the only one is {TINY_CHAT!r}")
    return str(_build_once(cache_root() / "tiny-chat", _write_tiny_chat))


def _build_once(target: Path, write: Callable[[Path], None]) -> Path:
    """Build into a temp dir next to `target` and rename it into place; losing the race is fine."""
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write(tmp)
        (tmp / ".complete").write_text("ok\n")
        try:
            os.rename(tmp, target)
            log.info("built %s", target)
        except OSError:
            if not (target / ".complete").exists():  # a stale, torn copy from a killed build
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _examples(rng: random.Random, n: int) -> list[dict[str, object]]:
    """Templated arithmetic: a pattern a 2-layer model can pick up in a few dozen steps."""
    rows: list[dict[str, object]] = []
    for _ in range(n):
        word, fn = rng.choice(_OPS)
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        question = f"What is {a} {word} {b}?"
        answer = f"{a} {word} {b} is {fn(a, b)}."
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        rows.append({TEXT_FIELD: f"Question: {question}\nAnswer: {answer}", "messages": messages})
    return rows


def _write_tiny_chat(out: Path) -> None:
    """train.jsonl and test.jsonl, deterministic (fixed seeds), loadable by the jsonl path of data.py."""
    for split, seed, n in (("train", 1, 2048), ("test", 2, 64)):
        rows = _examples(random.Random(seed), n)
        with open(out / f"{split}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def _write_tiny_llama(out: Path) -> None:
    """Train a byte-level BPE tokenizer on generated text, then save a randomly initialised tiny Llama."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = [str(r[TEXT_FIELD]) for r in _examples(random.Random(0), 4000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # Like Llama's tokenizer: `add_special_tokens=True` prepends BOS (what data.addSpecialTokens switches).
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=0.2,  # wide enough that a frozen lm_head can express confident predictions
    )
    LlamaForCausalLM(config).save_pretrained(out)
