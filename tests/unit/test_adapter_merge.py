"""Merging an adapter module by module gives exactly PEFT's merge_and_unload, and leaves the model unmerged."""

import copy

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from finetune_trainer.adapters import merged_state_dict


def test_module_by_module_merge_equals_peft_merge_and_unload() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False,
    )
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, param in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero: make the adapter change something
            param.data.normal_(0, 0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    merged = merged_state_dict(model, zero3=False, is_main=True)

    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert merged.keys() == expected.keys()
    assert all(torch.equal(merged[k], expected[k]) for k in expected)
    up = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(merged[up], before[f"base_model.model.{up.replace('.weight', '.base_layer.weight')}"])
    after = model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before), "the live model must be left unmerged"
    assert merged_state_dict(model, zero3=False, is_main=False) == {}
