"""Chat templates (chatml, zephyr) and the special tokens each one needs, as in PEFT's `examples/sft`.

A template is only applied to message lists (`[{"role": ..., "content": ...}, ...]`); plain text is left
alone. Tokens a template uses but the tokenizer lacks are added as special tokens, and the caller resizes
the model's embeddings to match (the new rows start untrained, which is why the built-in tiny tokenizer ships
with them). This module knows nothing about datasets or models.
"""

from __future__ import annotations

from typing import Any, Literal

ChatFormat = Literal["chatml", "zephyr", "none"]

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ZEPHYR = (
    "{% for message in messages %}"
    "{{'<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
_TEMPLATES: dict[str, tuple[str, list[str]]] = {
    "chatml": (CHATML, ["<|im_start|>", "<|im_end|>"]),
    "zephyr": (ZEPHYR, ["<|user|>", "<|assistant|>", "<|system|>"]),
}


def install_chat_template(tokenizer: Any, fmt: ChatFormat) -> int:
    """Set the template on the tokenizer and add its missing tokens; returns how many tokens were added."""
    if fmt == "none":
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return 0
    template, tokens = _TEMPLATES[fmt]
    vocab = tokenizer.get_vocab()
    missing = [t for t in tokens if t not in vocab]
    added = int(tokenizer.add_special_tokens({"additional_special_tokens": missing})) if missing else 0
    tokenizer.chat_template = template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return added


def is_messages(value: Any) -> bool:
    """True for a chat: a non-empty list of {"role", "content"} dicts."""
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )


def render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """One conversation as training text (no generation prompt: the assistant turn is part of the text)."""
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False))
