"""`training.precision: fp8` in the trainer (finetune_trainer.fp8), on CPU: `torch._scaled_mm` with row-wise
scales runs there too, so this is the code path a GPU runs, checked against float64.

The error bound: e4m3 keeps 3 mantissa bits, so one rounding is off by at most 2^-4 relative (6.25%); the round
trip of the data below measures 1.5% relative Frobenius error, and a matmul of two row-scaled operands 2.8%
(forward) and 3.1% (input gradient), outliers included (bf16 alone: 0.2%). `ERROR_BOUND` (5%) passes that and
fails what a wrong scale (72%) or a transposed weight (over 400%) gives, which is checked too.
"""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from finetune_api import constants  # noqa: E402
from finetune_api.constants import EXIT_INVALID_CONFIG  # noqa: E402
from finetune_api.termination import TerminationRecord  # noqa: E402
from finetune_trainer import fp8  # noqa: E402
from finetune_trainer.fp8 import BF16_EDGE_LAYERS, Float8FrozenLinear, apply_fp8, quantize_rows  # noqa: E402
from tests.trainer.launching import write_config  # noqa: E402

ERROR_BOUND = 0.05
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().double() - want).norm() / want.norm())


def _with_outliers(*shape: int, seed: int) -> torch.Tensor:
    """Normal values with a few entries 30x larger, as LLM activations have (a handful of hot channels)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    hot = torch.randint(0, shape[-1], (3,), generator=g)
    x[..., hot] *= 30
    return x


def _frozen_linear(k: int, n: int, *, bias: bool = False, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(k, n, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(_with_outliers(n, k, seed=seed + 1) * k**-0.5)
    linear.requires_grad_(False)
    return linear


def test_quantize_rows_round_trip_is_within_e4m3_rounding() -> None:
    x = _with_outliers(37, 96, seed=0)
    q, scale = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (37, 1)
    # every row's largest magnitude maps to e4m3's largest value, 448
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((37,), fp8.E4M3_MAX))
    back = q.float() * scale
    # 3 mantissa bits: half a step is 2^-4 of the value; below e4m3's normal range (2^-6) the step is 2^-9
    assert ((back - x).abs() <= x.abs() * 2**-4 + scale * 2**-10).all()
    assert _rel(back, x.double()) < 0.03


def test_an_all_zero_row_quantizes_to_zeros() -> None:
    q, scale = quantize_rows(torch.zeros(2, 32))
    assert torch.equal(q.float(), torch.zeros(2, 32)) and torch.isfinite(scale).all()


@pytest.mark.parametrize("bias", [False, True])
def test_forward_and_input_gradient_match_float64(bias: bool) -> None:
    linear = _frozen_linear(96, 80, bias=bias)
    layer = Float8FrozenLinear.from_linear(linear)
    x = _with_outliers(64, 96, seed=2).to(torch.bfloat16).requires_grad_(True)
    y = layer(x)
    w = linear.weight.double()
    want = x.detach().double() @ w.t() + (linear.bias.double() if bias else 0)
    assert y.dtype == torch.bfloat16 and _rel(y, want) < ERROR_BOUND
    dy = _with_outliers(64, 80, seed=3).to(torch.bfloat16)
    y.backward(dy)
    assert x.grad is not None and _rel(x.grad, dy.double() @ w) < ERROR_BOUND


def test_the_bound_catches_a_wrong_scale_and_a_transposed_weight() -> None:
    """The checks above would fail a broken layer: scales of the wrong rows, or W where W^T belongs."""
    linear = _frozen_linear(64, 64)
    layer = Float8FrozenLinear.from_linear(linear)
    x = _with_outliers(32, 64, seed=4).to(torch.bfloat16)
    want = x.double() @ linear.weight.double().t()
    assert _rel(layer(x), want) < ERROR_BOUND
    wrong_scale = Float8FrozenLinear.from_linear(linear)
    wrong_scale.s_fwd.copy_(wrong_scale.s_fwd.roll(1))  # each output row scaled by its neighbour's amax
    assert _rel(wrong_scale(x), want) > 4 * ERROR_BOUND
    transposed = Float8FrozenLinear.from_linear(linear)
    transposed.w_fwd.copy_(transposed.w_bwd)
    transposed.s_fwd.copy_(transposed.s_bwd)
    assert _rel(transposed(x), want) > 4 * ERROR_BOUND


def test_leading_dimensions_and_row_counts_that_are_not_multiples_of_16() -> None:
    """Rows are quantized one by one, so a padded or reshaped call gives each row exactly what it gets alone."""
    layer = Float8FrozenLinear.from_linear(_frozen_linear(48, 32))
    x = _with_outliers(3, 7, 48, seed=5).to(torch.bfloat16).requires_grad_(True)
    y = layer(x)
    assert y.shape == (3, 7, 32)
    flat = x.detach().reshape(21, 48)
    assert torch.equal(y.detach().reshape(21, 32), layer(flat))
    assert torch.equal(layer(flat[:5]), layer(flat)[:5])  # 5 rows padded to 16, 21 to 32
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_the_frozen_weight_gets_no_gradient_and_is_gone() -> None:
    layer = Float8FrozenLinear.from_linear(_frozen_linear(32, 48, bias=True))
    x = torch.randn(16, 32, dtype=torch.bfloat16, requires_grad=True)
    layer(x).sum().backward()
    assert not hasattr(layer, "weight")
    assert [(n, p.requires_grad, p.grad) for n, p in layer.named_parameters()] == [("bias", False, None)]
    assert x.grad is not None


def test_a_whole_module_cast_leaves_the_fp8_copies_alone() -> None:
    """DeepSpeed casts the whole model with `module.bfloat16()`; e4m3 and fp32 scales must survive it."""
    layer = Float8FrozenLinear.from_linear(_frozen_linear(32, 48))
    x = torch.randn(16, 32, dtype=torch.bfloat16)
    before = layer(x)
    layer.bfloat16()
    assert {b.dtype for b in layer.buffers()} == {torch.float8_e4m3fn, torch.float32}
    assert torch.equal(layer(x), before)


def _tiny_peft_llama(dtype: torch.dtype = torch.bfloat16, layers: int = 2) -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear")
    return peft.get_peft_model(model, lora)


def test_apply_fp8_swaps_the_decoder_base_linears_and_leaves_the_checkpoint_alone() -> None:
    model = _tiny_peft_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    adapter_before = peft.get_peft_model_state_dict(model)

    assert apply_fp8(model, edge_layers=0) == 2 * 7  # q, k, v, o, gate, up, down in each of 2 layers

    swapped = [n for n, m in model.named_modules() if isinstance(m, Float8FrozenLinear)]
    assert len(swapped) == 14 and all(n.endswith(".base_layer") and ".layers." in n for n in swapped)
    adapter_linears = [m for n, m in model.named_modules() if n.endswith((".lora_A.default", ".lora_B.default"))]
    assert len(adapter_linears) == 28 and all(type(m) is nn.Linear for m in adapter_linears)
    assert type(model.base_model.model.lm_head) is nn.Linear  # lm_head and embeddings stay bf16
    after = model.state_dict()
    # the base weights that became FP8 leave the state_dict; nothing else changes, nothing is added
    assert set(after) == {k for k in before if not (".layers." in k and k.endswith(".base_layer.weight"))}
    assert all(torch.equal(after[k], before[k]) for k in after)
    adapter_after = peft.get_peft_model_state_dict(model)
    assert adapter_after.keys() == adapter_before.keys()
    assert all(torch.equal(adapter_after[k], adapter_before[k]) for k in adapter_before)
    ignored = set(model._ddp_params_and_buffers_to_ignore)
    buffers = {n for n, _ in model.named_buffers() if n.rsplit(".", 1)[-1] in ("w_fwd", "s_fwd", "w_bwd", "s_bwd")}
    assert ignored == buffers and len(buffers) == 4 * 14


def test_apply_fp8_keeps_the_first_and_last_decoder_layers_bf16_by_default() -> None:
    model = _tiny_peft_llama(layers=4)

    assert BF16_EDGE_LAYERS == 1 and apply_fp8(model) == 2 * 7  # layers 1 and 2 of 0..3

    swapped = [n for n, m in model.named_modules() if isinstance(m, Float8FrozenLinear)]
    assert {n.split(".layers.")[1].split(".")[0] for n in swapped} == {"1", "2"}
    bf16_bases = [n for n, m in model.named_modules() if n.endswith(".base_layer") and type(m) is nn.Linear]
    assert len(bf16_bases) == 2 * 7 and all(".layers.0." in n or ".layers.3." in n for n in bf16_bases)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 96, (4, 48), generator=torch.Generator().manual_seed(7))
    return {"input_ids": ids, "labels": ids}


def test_a_lora_step_in_fp8_trains_the_adapter_with_a_loss_close_to_bf16s() -> None:
    reference = _tiny_peft_llama()
    model = _tiny_peft_llama()
    apply_fp8(model, edge_layers=0)
    for name, param in model.named_parameters():  # a non-zero B, so that lora_A gets a gradient too
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    reference.load_state_dict(model.state_dict(), strict=False)
    ref_loss = float(reference(**_batch()).loss.detach())

    lora_b = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss = model(**_batch()).loss
    loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    optimizer.step()

    assert torch.isfinite(loss) and abs(float(loss) - ref_loss) / ref_loss < 0.01
    assert all(not torch.equal(p.detach(), lora_b[n]) for n, p in model.named_parameters() if n in lora_b)
    assert float(model(**_batch()).loss) < float(loss)


def test_apply_fp8_traces_in_torch_compile_without_graph_breaks() -> None:
    """The trainer compiles each decoder layer; the FP8 layers inside must not split its graph."""
    from torch._dynamo.utils import counters

    model = _tiny_peft_llama()
    apply_fp8(model, edge_layers=0)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="eager", fullgraph=False)
    loss = compiled(**_batch()).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert dict(counters["graph_break"]) == {}
    layer = model.base_model.model.model.layers[0]
    hidden = torch.randn(2, 24, 64, dtype=torch.bfloat16, requires_grad=True)
    position = torch.arange(24).unsqueeze(0).expand(2, -1)
    rotary = model.base_model.model.model.rotary_emb(hidden, position)
    torch._dynamo.reset()
    out = torch.compile(layer, backend="eager", fullgraph=True)(hidden, position_embeddings=rotary)
    (out[0] if isinstance(out, tuple) else out).float().sum().backward()
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()


def test_compiled_through_aot_autograd_it_gives_eagers_numbers() -> None:
    """AOTAutograd traces the forward and the backward into graphs (what inductor compiles): the same output and
    input gradient as eager, bit for bit, with the FP8 matmul kept as one opaque operator."""
    layer = Float8FrozenLinear.from_linear(_frozen_linear(64, 48))
    x = _with_outliers(2, 9, 64, seed=8).to(torch.bfloat16)
    dy = _with_outliers(2, 9, 48, seed=9).to(torch.bfloat16)
    xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    torch._dynamo.reset()
    eager, compiled = layer(xe), torch.compile(layer, backend="aot_eager", fullgraph=True)(xc)
    eager.backward(dy)
    compiled.backward(dy)
    assert torch.equal(compiled, eager)
    assert xe.grad is not None and xc.grad is not None and torch.equal(xc.grad, xe.grad) and xe.grad.abs().sum() > 0


def test_a_dynamic_token_count_compiles_once_whatever_the_rows_modulo_16() -> None:
    """The trainer's compiled decoder layers take any token count; padding must not make the graph guard on it."""
    from torch._dynamo.utils import counters

    layer = Float8FrozenLinear.from_linear(_frozen_linear(64, 32))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(layer, backend="aot_eager", dynamic=True, fullgraph=True)
    for rows in (21, 32, 17, 48, 5):
        x = torch.randn(rows, 64, dtype=torch.bfloat16)
        assert torch.equal(compiled(x), layer(x))
    assert counters["stats"]["unique_graphs"] == 1


def test_no_cuda_device_is_refused_with_the_field_and_the_reason() -> None:
    assert fp8.fp8_problem(cuda_available=False) == (
        "training.precision: fp8 needs FP8 matmuls (compute capability 8.9 or newer: Ada, Hopper, Blackwell); "
        "this machine has no CUDA device: set training.precision: default, or run the job on such GPUs"
    )


def test_a_gpu_older_than_ada_is_refused_by_name_and_capability() -> None:
    name, capability = A100
    assert fp8.fp8_problem(cuda_available=True, name=name, capability=capability) == (
        "training.precision: fp8 needs FP8 matmuls (compute capability 8.9 or newer: Ada, Hopper, Blackwell); "
        "cuda:0 is NVIDIA A100-SXM4-80GB (8.0): set training.precision: default, or run the job on such GPUs"
    )
    for ok in [(8, 9), (9, 0), (10, 0)]:
        assert fp8.fp8_problem(cuda_available=True, name="x", capability=ok) is None


def test_the_trainer_refuses_fp8_here_before_loading_anything() -> None:
    """On this machine (no CUDA in CI) the check the trainer runs first says why; under ZeRO-3 on any machine."""
    assert "ZeRO-3" in (fp8.fp8_config_problem(zero_stage=3) or "")
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: the no-device refusal does not apply")
    assert fp8.fp8_config_problem(zero_stage=0) == fp8.fp8_problem(cuda_available=False)


def test_the_trainer_exits_64_with_the_reason_before_loading_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole trainer on this machine (no CUDA in CI): exit 64 and a termination record the operator shows,
    before the built-in model is even resolved (an unresolvable model name proves it is never loaded)."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: the no-device refusal does not apply")
    from finetune_trainer.__main__ import main

    monkeypatch.setenv(constants.ENV_EXIT_FILE, str(tmp_path / "exit.json"))
    config = write_config(
        tmp_path,
        model={"name": "builtin:no-such-model"},
        training={"precision": "fp8", "mixedPrecision": "bf16"},
        strategy={"zeroStage": 0, "dtype": "bfloat16"},
    )
    assert main(["--config", str(config)]) == EXIT_INVALID_CONFIG
    record = TerminationRecord.model_validate_json((tmp_path / "exit.json").read_text())
    assert record.exit_code == EXIT_INVALID_CONFIG and record.reason == "InvalidConfigError"
    assert record.message == fp8.fp8_problem(cuda_available=False)
