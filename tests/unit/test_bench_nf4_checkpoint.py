"""bench/make_models.py --nf4-storage: a checkpoint stored already quantized loads as the seed recipe's QLoRA
path would quantize the same bf16 weights.

The seed recipe (the PEFT guide's DeepSpeed ZeRO-3 recipe with LoRA and QLoRA) quantizes while loading a bf16
checkpoint; a 70B one is 138 GB, more than the one-GPU bench host's disk, so the bench stores the weights in
bitsandbytes' serialized 4-bit form (37 GB). Checked on a tiny Llama: the same random draws written once as bf16
and once pre-quantized, both loaded by `from_pretrained` with the recipe's `BitsAndBytesConfig`, give the same
logits bit for bit, every decoder linear is a 4-bit layer, and the logits differ from the unquantized model's
(the check sees the quantization). Needs bitsandbytes (its CPU backend quantizes): installed with the `gpu` extra;
where CUDA is present, transformers puts the 4-bit models on the GPU.
"""

import argparse
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import make_models  # noqa: E402
from seed.seed_baseline import guide_bnb_config  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def _write(out: Path, encode: make_models.Encoding) -> None:
    cfg = make_models.llama_config(*make_models.SHAPES["small"])
    if encode is make_models.nf4_encoding:
        cfg.quantization_config = guide_bnb_config()
    # drawn and quantized where from_pretrained will quantize the bf16 twin: on the GPU when there is one
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    make_models.make_model_random(argparse.Namespace(device=device), out, cfg, encode)


def test_prequantized_checkpoint_loads_as_the_recipe_quantizes(tmp_path: Path) -> None:
    _write(tmp_path / "bf16", lambda key, weight: {key: weight})
    _write(tmp_path / "nf4", make_models.nf4_encoding)
    stored = sum(f.stat().st_size for f in (tmp_path / "nf4").glob("*.safetensors"))
    assert stored < 0.4 * sum(f.stat().st_size for f in (tmp_path / "bf16").glob("*.safetensors"))

    load = dict(quantization_config=guide_bnb_config(), dtype=torch.bfloat16)
    quantized_on_load = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", **load)
    prequantized = AutoModelForCausalLM.from_pretrained(tmp_path / "nf4", **load)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)

    linears = [m for n, m in prequantized.named_modules() if n.endswith("_proj")]
    assert linears and all(isinstance(m, bnb.nn.Linear4bit) for m in linears)
    assert all(m.weight.quant_state.nested for m in linears)  # double quantization, as the recipe sets it
    ids = torch.randint(4, 1024, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got, unquantized = (
            m(ids.to(m.device)).logits.float().cpu() for m in (quantized_on_load, prequantized, plain)
        )
    assert torch.equal(got, want)
    assert (got - unquantized).abs().max() > 1e-2
