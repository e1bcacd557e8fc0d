"""Local model directories and datasets for the benchmarks: nothing is downloaded.

model: a Llama-architecture model of a given shape with random weights (bf16, saved with save_pretrained, so the
       trainer loads it through its ordinary from_pretrained path, QLoRA quantization included), and a word-level
       tokenizer whose token i is the word `w<i>` (0 <pad>, 1 <eos>, 2 <unk>, 3 <bos>).
data:  train.jsonl rows {"content": "w17 w90211 ..."} of exactly --row-len tokens under that tokenizer, drawn like
       the seed benchmark's rows (torch.randint(4, vocab) with generator seed 1234), so the seed recipe and our
       trainer see the same token ids.

       --fp8-storage: every 2-D weight is written as float8_e4m3fn (norms stay bf16), so a 70B-shaped checkpoint is
       69 GB on disk instead of 138 (the 2x H200 host had 128 GiB of free disk); `from_pretrained(dtype=bfloat16)`
       casts it back on load, and QLoRA quantizes the cast values. Tensors are drawn one at a time on --device, never the
       whole model: written shard by shard (5 GB), with a safetensors index.
       --nf4-storage: every linear weight of the decoder layers stored as the seed recipe's QLoRA loading would
       quantize it (`nf4_encoding`), with that quantization config in config.json, so `from_pretrained` with the
       recipe's BitsAndBytesConfig loads the 4-bit weights as stored: a 70B-shaped checkpoint is 37 GB (the one-GPU
       host has 64 GiB of disk). Needs bitsandbytes; built on --device like the fp8 one.

usage: make_models.py model --out DIR [--layers ... shape] [--device cuda:0] [--fp8-storage | --nf4-storage]
       make_models.py data --out DIR --rows N --row-len 2048 --vocab 128256
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHAPES = {
    # name: layers, hidden, intermediate, heads, kv_heads, vocab
    "llama3-8b": (32, 4096, 14336, 32, 8, 128256),
    "llama2-70b": (80, 8192, 28672, 64, 8, 32000),
    "small": (4, 512, 1536, 8, 4, 1024),
}


def build_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "<bos>"] + [f"w{i}" for i in range(4, vocab)]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", bos_token="<bos>"
    )


def llama_config(layers: int, hidden: int, inter: int, heads: int, kv: int, vocab: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        hidden_act="silu",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=3,
        eos_token_id=1,
    )


def make_model(a: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(a.out)
    if (out / ".complete").exists():
        print(f"{out}: exists")
        return
    out.mkdir(parents=True, exist_ok=True)
    layers, hidden, inter, heads, kv, vocab = SHAPES[a.shape] if a.shape else (
        a.layers, a.hidden, a.intermediate, a.heads, a.kv_heads, a.vocab)
    if a.layers_override:
        layers = a.layers_override
    t0 = time.time()
    build_tokenizer(vocab).save_pretrained(out)
    cfg = llama_config(layers, hidden, inter, heads, kv, vocab)
    if a.fp8_storage or a.nf4_storage:
        if a.nf4_storage:
            from seed.seed_baseline import guide_bnb_config

            cfg.quantization_config = guide_bnb_config()  # what from_pretrained reads back: no second quantization
        n = make_model_random(a, out, cfg, nf4_encoding if a.nf4_storage else fp8_encoding)
        (out / "bench_shape.json").write_text(json.dumps(
            dict(layers=layers, hidden=hidden, intermediate=inter, heads=heads, kv_heads=kv, vocab=vocab,
                 num_parameters=n, storage="nf4" if a.nf4_storage else "float8_e4m3fn")))
        (out / ".complete").write_text("ok\n")
        return
    torch.manual_seed(0)
    with torch.device(a.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    n = sum(p.numel() for p in model.parameters())
    t1 = time.time()
    model.save_pretrained(out, max_shard_size="8GB")
    t2 = time.time()
    (out / "bench_shape.json").write_text(json.dumps(
        dict(layers=layers, hidden=hidden, intermediate=inter, heads=heads, kv_heads=kv, vocab=vocab,
             num_parameters=n)))
    (out / ".complete").write_text("ok\n")
    print(f"{out}: {n / 1e9:.3f}B params, built {t1 - t0:.1f}s, saved {t2 - t1:.1f}s", flush=True)


Encoding = Callable[[str, Any], dict[str, Any]]
"""How one random bf16 tensor is stored: (state-dict name, tensor) -> the tensors written for it."""


def make_model_random(a: argparse.Namespace, out: Path, cfg, encode: Encoding) -> int:
    """Write `cfg`'s model with random weights (2-D: normal, std 0.02; norms: ones) as safetensors shards (5 GB)
    with an index, drawing one tensor at a time on --device and passing it through `encode` (name, bf16 tensor)
    -> the tensors stored for it. Returns the number of parameters."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    gen = torch.Generator(device=a.device).manual_seed(0)
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    files: list[list[str]] = []
    total = n = size = 0

    def flush() -> None:
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file({k: v.cpu() for k, v in shard.items()}, str(out / name), metadata={"format": "pt"})
        files.append(list(shard))
        for k in shard:
            weight_map[k] = name
        shard.clear()

    for key, p in meta.state_dict().items():
        if p.dim() == 1:  # RMSNorm weights: ones, as the model initialises them
            stored = {key: torch.ones(p.shape, dtype=torch.bfloat16, device=a.device)}
        else:
            stored = encode(key, torch.randn(p.shape, generator=gen, device=a.device, dtype=torch.bfloat16) * 0.02)
        n += p.numel()
        for k, t in stored.items():
            shard[k] = t
            size += t.numel() * t.element_size()
            total += t.numel() * t.element_size()
        if size >= 5 * 10**9:
            flush()
            size = 0
    if shard:
        flush()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    cfg.dtype = "bfloat16"
    cfg.save_pretrained(out)
    print(f"{out}: {n / 1e9:.3f}B params, {total / 1e9:.1f} GB in {len(files)} shards, {time.time() - t0:.1f}s",
          flush=True)
    return n


def fp8_encoding(key: str, weight: Any) -> dict[str, Any]:
    """--fp8-storage: the weight as float8_e4m3fn (cast back to bf16 by `from_pretrained(dtype=bfloat16)`)."""
    import torch

    return {key: weight.to(torch.float8_e4m3fn)}


def nf4_encoding(key: str, weight: Any) -> dict[str, Any]:
    """--nf4-storage: a linear layer's weight quantized as the seed recipe's BitsAndBytesConfig quantizes it while
    loading (nf4, blocks of 64, nested absmax, bf16 storage; `seed.seed_baseline.guide_bnb_config`), in
    bitsandbytes' serialized form (the packed weight plus `weight.absmax`, `weight.quant_map`, ... as a quantized
    model's `save_pretrained` writes them). The embeddings and the LM head stay bf16: transformers does not
    quantize them."""
    import torch
    from bitsandbytes.functional import quantize_4bit

    if not key.endswith("_proj.weight"):
        return {key: weight}
    packed, state = quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4",
                                  quant_storage=torch.bfloat16)
    prefix = key.removesuffix("weight")
    return {key: packed, **{f"{prefix}weight.{k}": v for k, v in state.as_dict(packed=True).items()}}


ARITH_DIGIT, ARITH_PLUS, ARITH_EQUALS, ARITH_END = 10, 20, 21, 22  # token ids: digits d -> w(10 + d), "+", "=", ";"


def arithmetic_row(gen, row_len: int) -> list[int]:
    """`row_len` tokens of additions "a + b = c ;" (a, b < 1000, digit by digit): a corpus a model can learn (the
    operators, separators and the sum's digits follow from what came before), for loss comparisons that mean
    something, unlike rows of uniform random tokens whose loss stays at log(vocab)."""
    import torch

    row: list[int] = []
    while len(row) < row_len:
        x, y = (int(v) for v in torch.randint(0, 1000, (2,), generator=gen))
        digits = lambda n: [ARITH_DIGIT + int(c) for c in str(n)]  # noqa: E731
        row += [*digits(x), ARITH_PLUS, *digits(y), ARITH_EQUALS, *digits(x + y), ARITH_END]
    return row[:row_len]


def write_rows(path: Path, rows: list[list[int]], lengths: list[int]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        for row, n in zip(rows, lengths):
            f.write(json.dumps({"content": " ".join(f"w{i}" for i in row[:n])}) + "\n")
    os.replace(tmp, path)


def make_data(a: argparse.Namespace) -> None:
    import torch

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(a.seed)
    if a.arithmetic:  # train.jsonl and a held-out test.jsonl (another seed) of arithmetic rows
        write_rows(out / "train.jsonl", [arithmetic_row(gen, a.row_len) for _ in range(a.rows)], [a.row_len] * a.rows)
        held_out = torch.Generator().manual_seed(a.seed + 1)
        rows = [arithmetic_row(held_out, a.row_len) for _ in range(a.eval_rows)]
        write_rows(out / "test.jsonl", rows, [a.row_len] * a.eval_rows)
        print(f"{out}: {a.rows} + {a.eval_rows} arithmetic rows of {a.row_len} tokens", flush=True)
        return
    ids = torch.randint(4, a.vocab, (a.rows, a.row_len), generator=gen, dtype=torch.int64)
    lengths = [a.row_len] * a.rows
    if a.lognormal_median:
        # documents of varying length (recompile measurements): lognormal around the median, within [16, row_len]
        import math

        draw = torch.empty(a.rows).log_normal_(math.log(a.lognormal_median), a.sigma, generator=gen)
        lengths = [max(16, min(a.row_len, int(x))) for x in draw.tolist()]
    write_rows(out / "train.jsonl", ids.tolist(), lengths)
    shown = sorted(lengths)[len(lengths) // 2]
    print(f"{out}: {a.rows} rows, median {shown} tokens (max {a.row_len})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("--out", required=True)
    m.add_argument("--shape", choices=sorted(SHAPES), default=None)
    m.add_argument("--layers-override", type=int, default=None)
    m.add_argument("--layers", type=int, default=32)
    m.add_argument("--hidden", type=int, default=4096)
    m.add_argument("--intermediate", type=int, default=14336)
    m.add_argument("--heads", type=int, default=32)
    m.add_argument("--kv-heads", type=int, default=8)
    m.add_argument("--vocab", type=int, default=128256)
    m.add_argument("--device", default="cuda:0")
    m.add_argument("--fp8-storage", action="store_true")
    m.add_argument("--nf4-storage", action="store_true")
    d = sub.add_parser("data")
    d.add_argument("--out", required=True)
    d.add_argument("--rows", type=int, default=128)
    d.add_argument("--row-len", type=int, default=2048)
    d.add_argument("--vocab", type=int, default=128256)
    d.add_argument("--seed", type=int, default=1234)
    d.add_argument("--lognormal-median", type=int, default=0, help="rows of lognormal lengths with this median")
    d.add_argument("--sigma", type=float, default=0.8, help="the lognormal's sigma (log-space)")
    d.add_argument("--arithmetic", action="store_true", help="learnable rows of additions, and a test split")
    d.add_argument("--eval-rows", type=int, default=32, help="with --arithmetic: rows of the test split")
    a = p.parse_args()
    make_model(a) if a.cmd == "model" else make_data(a)


if __name__ == "__main__":
    main()
