"""QLoRA + ZeRO-3 loading (trainer/finetune_trainer/zero3_loading.py): 4-bit weights partitioned while loading.

Two ranks load the same tiny Llama with bitsandbytes nf4 (double quant, bf16 storage) under a ZeRO-3 config, once
the way transformers does it alone (each rank holds the whole quantized model) and once with each weight partitioned
as it is quantized. Checked on every rank: every Linear4bit weight is a ZeRO-3 parameter holding only this rank's
slice, its quantization state is intact, gathered it is bit for bit the weight of the plain load, and the gathered
model's logits equal the plain model's; and three LoRA steps through `deepspeed.initialize` give the same losses
from either load. On CUDA with 2 GPUs (NCCL); on CPU with gloo where bitsandbytes is installed
(its CPU backend quantizes too), so the logic can be checked without a GPU.
"""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("deepspeed")
pytest.importorskip("bitsandbytes")

CUDA = torch.cuda.is_available() and torch.cuda.device_count() >= 2
WORLD = 2

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tiny_llama(path: str) -> None:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


def _setup(rank: int, port: int) -> torch.device:
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(WORLD),
            "LOCAL_WORLD_SIZE": str(WORLD),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    if not CUDA:
        os.environ["DS_ACCELERATOR"] = "cpu"
        import importlib

        # gloo does the collectives (finetune_trainer/cpu.py; `import deepspeed.comm.torch` would name torch)
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    import deepspeed

    device = torch.device("cuda", rank) if CUDA else torch.device("cpu")
    if CUDA:
        torch.cuda.set_device(device)
    deepspeed.init_distributed(dist_backend="nccl" if CUDA else "gloo")
    return device


def _load_kwargs() -> dict:
    from transformers import BitsAndBytesConfig

    bnb_cfg = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_quant_storage=torch.bfloat16,
    )
    return {"dtype": torch.bfloat16, "quantization_config": bnb_cfg}


def _worker(rank: int, path: str, port: int, out: str) -> None:
    device = _setup(rank, port)
    import bitsandbytes as bnb
    import deepspeed
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    from finetune_trainer.zero3_loading import partition_4bit_weights_while_loading

    kwargs = _load_kwargs()
    ids = torch.arange(1, 33, device=device).reshape(1, 32)

    # no ZeRO-3 config alive: transformers alone, the whole quantized model on this rank's device
    plain = AutoModelForCausalLM.from_pretrained(path, device_map={"": device}, **kwargs)
    ref = {n: m.weight.data.clone() for n, m in plain.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    ref_absmax = {n: m.weight.quant_state.absmax.clone() for n, m in plain.named_modules() if n in ref}

    keep = HfDeepSpeedConfig(DS_CONFIG)  # noqa: F841 - is_deepspeed_zero3_enabled() while it lives
    with partition_4bit_weights_while_loading() as stats:  # no device_map under ZeRO-3 (the trainer passes none)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert set(linears) == set(ref) and stats["partitioned"] == len(ref) == 14, stats
    for name, m in linears.items():
        w = m.weight
        assert isinstance(w, bnb.nn.Params4bit) and hasattr(w, "ds_id"), name
        assert w.data.numel() == 0, (name, w.data.shape)  # only the slice in ds_tensor stays
        assert tuple(w.ds_shape) == tuple(ref[name].shape), name
        assert w.ds_tensor.numel() == -(-ref[name].numel() // WORLD), name
        assert torch.equal(w.quant_state.absmax, ref_absmax[name]), name
    # the unquantized modules are left to deepspeed.initialize
    assert not hasattr(model.model.embed_tokens.weight, "ds_id")
    assert not hasattr(model.lm_head.weight, "ds_id")
    with deepspeed.zero.GatheredParameters([m.weight for m in linears.values()]):
        for name, m in linears.items():  # as bytes: packed 4-bit values read as bf16 include NaNs
            assert m.weight.data.shape == ref[name].shape, name
            assert torch.equal(m.weight.data.view(torch.uint8), ref[name].view(torch.uint8)), name
        with torch.no_grad():  # both after the load, which lets DeepSpeed swap F.linear for its own
            logits = model(input_ids=ids).logits.float()
            ref_logits = plain(input_ids=ids).logits.float()
    assert torch.equal(logits, ref_logits)
    _report(rank, out, stats)


def _report(rank: int, out: str, result: object) -> None:
    """Rank 0 writes what it found (the test reads it), then every rank leaves the process group."""
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"ok {result}")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _spawn(worker, tmp_path) -> str:
    """Run `worker(rank, model_path, port, out)` on WORLD ranks over a fresh tiny model; rank 0's report."""
    import torch.multiprocessing as mp

    path = str(tmp_path / "tiny")
    _tiny_llama(path)
    out = tmp_path / "ok.txt"
    mp.spawn(worker, args=(path, _free_port(), str(out)), nprocs=WORLD, join=True)
    report = out.read_text()
    assert report.startswith("ok")
    return report


@pytest.mark.gpu
def test_4bit_weights_partitioned_while_loading_match_plain_load(tmp_path):
    _spawn(_worker, tmp_path)


def _train_worker(rank: int, path: str, port: int, out: str) -> None:
    """Three LoRA steps through deepspeed.initialize from each load: the losses must be equal."""
    import contextlib

    device = _setup(rank, port)
    import deepspeed
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    from finetune_trainer.zero3_loading import partition_4bit_weights_while_loading

    # a torch optimizer, as the Trainer passes one (DeepSpeed's own AdamW would JIT-build its fused CUDA kernel)
    config = {**DS_CONFIG, "zero_allow_untested_optimizer": True, "zero_optimization": {"stage": 3}}
    keep = HfDeepSpeedConfig(config)  # noqa: F841
    ids = torch.arange(1, 33, device=device).reshape(1, 32)
    losses = {}
    for mode in ("after deepspeed.initialize", "while loading"):
        partitioned = mode == "while loading"
        with partition_4bit_weights_while_loading() if partitioned else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(path, **_load_kwargs())
        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.to(torch.bfloat16)  # what TRL does for quantized models
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        losses[mode] = []
        for _ in range(3):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            losses[mode].append(loss.item())
        engine.destroy()
        del engine, model
    assert losses["while loading"] == losses["after deepspeed.initialize"], losses
    assert losses["while loading"][-1] < losses["while loading"][0], losses
    _report(rank, out, losses)


@pytest.mark.gpu
def test_training_from_either_load_is_the_same(tmp_path):
    print(_spawn(_train_worker, tmp_path))
