"""Kernel (and CPU op) names to the seven breakdown categories and the three summary kinds."""

from __future__ import annotations

import pytest

from systems.profiling.kernel_categories import (
    CATEGORIES,
    KIND_OF_CATEGORY,
    KINDS,
    classify_kernel,
    kind,
)


@pytest.mark.parametrize(("name", "category"), [
    # GPU kernels as torch.profiler names them
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT", "matmul"),
    ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64", "matmul"),
    ("triton_tem_fused_mm_0", "matmul"),
    ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
    ("fmha_cutlassB_bf16_aligned_64x64_k128_sm80", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
    ("flash_backward_dkdv_kernel", "attention"),
    ("_adamw_kernel", "optimizer"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
     "optimizer"),
    ("void at::native::cunn_SoftMaxForward<4, float, LogSoftMaxForwardEpilogue>", "loss"),
    ("nll_loss_forward_reduce_cuda_kernel_2d", "loss"),
    ("triton_red_fused__log_softmax_0", "loss"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm_elementwise"),
    ("triton_poi_fused_mul_silu_1", "norm_elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, BinaryFunctor<float>>", "norm_elementwise"),
    ("void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps>>", "norm_elementwise"),
    ("Memcpy DtoD (Device -> Device)", "memory"),
    ("Memset (Device)", "memory"),
    ("void at::native::indexSelectLargeIndex<float, long>", "other"),
    # CPU ops (the tool's fallback without a GPU)
    ("aten::mm", "matmul"),
    ("aten::addmm", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::_foreach_lerp_", "optimizer"),
    ("Optimizer.step#MixedPrecisionAdamW.step", "optimizer"),
    ("aten::logsumexp", "loss"),
    ("aten::mul", "norm_elementwise"),
    ("aten::rsqrt", "norm_elementwise"),
    ("aten::add_", "norm_elementwise"),
    ("aten::embedding", "other"),
    ("aten::multinomial", "other"),
])
def test_kernel_names_fall_in_their_category(name: str, category: str) -> None:
    assert classify_kernel(name) == category


def test_every_category_coarsens_to_a_kind() -> None:
    assert set(KIND_OF_CATEGORY) == set(CATEGORIES)
    assert set(KIND_OF_CATEGORY.values()) == set(KINDS)


def test_kind_by_kernel_name_then_launching_op() -> None:
    assert kind("sm90_xmma_gemm_f32f32_tf32f32", "aten::mm") == "matmul"
    assert kind("nvjet_tst_128x64", "aten::matmul") == "matmul"
    assert kind("vectorized_elementwise_kernel<4, MulFunctor>", "aten::mul") == "elementwise"
    assert kind("multi_tensor_apply_kernel", "aten::_foreach_sqrt") == "elementwise"
    assert kind("Memcpy DtoD (Device -> Device)", "aten::copy_") == "elementwise"
    assert kind("cunn_SoftMaxForward", "aten::_softmax") == "other"
    assert kind("flash_forward_kernel", "") == "other"
    # A kernel name that says nothing defers to the op that launched it.
    assert kind("void some_kernel<float>", "aten::bmm") == "matmul"
    assert kind("void some_kernel<float>", "aten::add_") == "elementwise"
    assert kind("void some_kernel<float>") == "other"
