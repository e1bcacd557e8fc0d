"""`training.precision: fp8` on a GPU with FP8 tensor cores: `Float8FrozenLinear` at Llama-8B shapes, in bf16,
against float64 (the CPU twin of these checks is tests/unit/test_fp8.py; skipped without a capable GPU).

Shapes: 8192 tokens (one 8192-token sequence, or 4 x 2048) through the MLP's up projection, 4096 -> 14336, and
back down, 14336 -> 4096; the same 5% relative Frobenius bound as on CPU, which e4m3 with row-wise scales meets
(about 3%) and a wrong scale or layout does not.
"""

import pytest

torch = pytest.importorskip("torch")

from finetune_trainer import fp8  # noqa: E402
from finetune_trainer.fp8 import Float8FrozenLinear  # noqa: E402

CAPABLE = torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= fp8.FP8_MIN_CAPABILITY
ERROR_BOUND = 0.05

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CAPABLE, reason="needs a GPU of compute capability >= 8.9")]


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().double() - want).norm() / want.norm())


def _with_outliers(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*shape, generator=g, device="cuda")
    hot = torch.randint(0, shape[-1], (8,), generator=g, device="cuda")
    x[..., hot] *= 30
    return x


@pytest.mark.parametrize(("tokens", "k", "n"), [(8192, 4096, 14336), (8192, 14336, 4096), (8190, 4096, 1024)])
def test_forward_and_input_gradient_match_float64_at_8b_shapes(tokens: int, k: int, n: int) -> None:
    linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        linear.weight.copy_(_with_outliers(n, k, seed=1) * k**-0.5)
    w = linear.weight.double()
    layer = Float8FrozenLinear.from_linear(linear)
    assert layer.w_fwd.device.type == "cuda"
    x = _with_outliers(tokens, k, seed=2).to(torch.bfloat16).requires_grad_(True)
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (tokens, n)
    assert _rel(y, x.detach().double() @ w.t()) < ERROR_BOUND
    dy = _with_outliers(tokens, n, seed=3).to(torch.bfloat16)
    y.backward(dy)
    assert x.grad is not None and _rel(x.grad, dy.double() @ w) < ERROR_BOUND


def test_leading_dimensions_and_a_wrong_scale_on_cuda() -> None:
    linear = torch.nn.Linear(4096, 4096, bias=False, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    layer = Float8FrozenLinear.from_linear(linear)
    x = _with_outliers(4, 2047, 4096, seed=4).to(torch.bfloat16)
    want = x.double() @ linear.weight.double().t()
    assert _rel(layer(x), want) < ERROR_BOUND
    layer.s_fwd[::2] *= 2  # every other output row's scale wrong by 2x: the check must see it
    assert _rel(layer(x), want) > 4 * ERROR_BOUND


def test_compiled_with_inductor_it_matches_eager() -> None:
    """The trainer compiles each decoder layer with inductor, which fuses the quantization: same numbers."""
    linear = torch.nn.Linear(4096, 14336, bias=False, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    layer = Float8FrozenLinear.from_linear(linear)
    x = _with_outliers(2, 1024, 4096, seed=5).to(torch.bfloat16)
    compiled = torch.compile(layer, fullgraph=True)
    xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    eager, fused = layer(xe), compiled(xc)
    assert _rel(fused, eager.double()) < 1e-2
    eager.sum().backward()  # a broadcast (stride-0) gradient
    fused.sum().backward()
    assert xe.grad is not None and xc.grad is not None and _rel(xc.grad, xe.grad.double()) < 1e-2
    dy = _with_outliers(2, 1024, 14336, seed=6).to(torch.bfloat16)  # an ordinary one
    xe.grad = xc.grad = None
    layer(xe).backward(dy)
    compiled(xc).backward(dy)
    assert xe.grad is not None and xc.grad is not None and _rel(xc.grad, xe.grad.double()) < 1e-2
