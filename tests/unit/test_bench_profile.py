"""bench/step_profile.py: GPU kernels grouped by what they do, per step."""

import sys
from pathlib import Path

from pytest import approx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import step_profile


def test_kernel_names_fall_into_their_groups():
    cases = {
        "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "matmul",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64": "matmul",
        "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>>": "attention",
        "triton_poi_fused__to_copy_mul_silu_0": "fused by inductor",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1": "fused by inductor",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>": "loss",
        "void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
        "Memcpy DtoD (Device -> Device)": "copies",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": "other",
    }
    for name, group in cases.items():
        assert step_profile.group_of(name) == group, name


def test_summary_is_per_step_and_idle_is_what_kernels_do_not_cover():
    kernels = [("nvjet_a", 0.30), ("nvjet_a", 0.30), ("triton_poi_fused_b", 0.10), ("flash_fwd", 0.20)]
    summary = step_profile.summarize(kernels, steps=2, wall_s=1.2)
    assert summary["gpu_busy_s_per_step"] == approx(0.45)
    assert summary["idle_s_per_step"] == approx(0.15)
    assert summary["groups_s_per_step"] == approx({"matmul": 0.30, "attention": 0.10, "fused by inductor": 0.05})
    assert summary["top_kernels_s_per_step"][0] == ["nvjet_a", 0.30]
    text = step_profile.render(summary)
    assert "matmul" in text and "50.0% of the step" in text
