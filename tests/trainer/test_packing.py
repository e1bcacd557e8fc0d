"""Packed documents do not attend to each other, on CPU with SDPA, the way TRL feeds them.

TRL's `bfd` packing is padding-free: the collator concatenates documents into one row, drops the attention
mask and restarts `position_ids` at 0 for each document. transformers' mask builder turns those restarts
into a block-diagonal causal mask for SDPA/eager (`masking_utils.find_packed_sequence_indices`); flash
attention gets `cu_seq_lens`. So each document's logits in the packed row equal its logits alone.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.trainer


def test_packed_documents_are_isolated(trainer_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTJOB_CACHE", trainer_env["FTJOB_CACHE"])
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from finetune_trainer import builtin

    path = builtin.resolve_model(builtin.TINY_LLAMA)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    model.config.use_cache = False
    docs = [tokenizer(t)["input_ids"] for t in ("What is 2 plus 2? 2 plus 2 is 4.", "What is 9 times 3? 27.")]
    batch = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id, padding_free=True)(
        [{"input_ids": d} for d in docs]
    )
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
        alone = [model(input_ids=torch.tensor([d])).logits[0] for d in docs]
        leaky = model(input_ids=batch["input_ids"]).logits[0]  # plain causal: doc 2 sees doc 1
    first = len(docs[0])
    torch.testing.assert_close(packed[:first], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[first:], alone[1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(leaky[first:], alone[1], atol=1e-3)
