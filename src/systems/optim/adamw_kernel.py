"""One AdamW step of one tensor in one Triton kernel, over an fp32 master copy.

The kernel reads the gradient (any float dtype), the fp32 master weight and both fp32
moments once, and writes the master, the moments and the low-precision parameter the model
computes with: 4 + 4 + 4 + g bytes read and 4 + 4 + 4 + p bytes written per element, the
least an AdamW step over fp32 state can move. The math follows `torch.optim.AdamW` (see
`systems.optim.AdamW`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

import systems.triton_runtime  # noqa: F401 - sets TRITON_INTERPRET before the kernel exists

BLOCK_SIZE = 4096


@triton.jit
def _adamw_kernel(param_ptr, grad_ptr, master_ptr, exp_avg_ptr, exp_avg_sq_ptr, numel,
                  lr, beta1, beta2, eps, weight_decay, step_size, bias_correction2_sqrt,
                  BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < numel
    grad = tl.load(grad_ptr + offsets, mask=mask).to(tl.float32)
    master = tl.load(master_ptr + offsets, mask=mask)
    exp_avg = tl.load(exp_avg_ptr + offsets, mask=mask)
    exp_avg_sq = tl.load(exp_avg_sq_ptr + offsets, mask=mask)
    master = master * (1.0 - lr * weight_decay)
    exp_avg = exp_avg + (1.0 - beta1) * (grad - exp_avg)
    exp_avg_sq = exp_avg_sq * beta2 + (1.0 - beta2) * grad * grad
    denom = tl.sqrt(exp_avg_sq) / bias_correction2_sqrt + eps
    master = master - step_size * exp_avg / denom
    tl.store(master_ptr + offsets, master, mask=mask)
    tl.store(exp_avg_ptr + offsets, exp_avg, mask=mask)
    tl.store(exp_avg_sq_ptr + offsets, exp_avg_sq, mask=mask)
    rounded = master.to(param_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    tl.store(param_ptr + offsets, rounded, mask=mask)


def fused_adamw_step_(
    param: torch.Tensor, grad: torch.Tensor, master: torch.Tensor, exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor, *, step: int, lr: float, beta1: float, beta2: float,
    eps: float, weight_decay: float,
) -> None:
    """Update `master`, `exp_avg`, `exp_avg_sq` in place (step number `step`, from 1) and
    write the new master, rounded, into `param`. All five must be contiguous and alike in
    shape; the state tensors fp32."""
    for name, state in (("master", master), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if state.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {state.dtype}")
    for name, tensor in (("param", param), ("grad", grad), ("master", master),
                         ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if tensor.shape != param.shape or not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous with shape {tuple(param.shape)}")
    numel = param.numel()
    _adamw_kernel[(triton.cdiv(numel, BLOCK_SIZE),)](
        param, grad, master, exp_avg, exp_avg_sq, numel,
        lr, beta1, beta2, eps, weight_decay, lr / (1.0 - beta1**step),
        math.sqrt(1.0 - beta2**step), BLOCK_SIZE=BLOCK_SIZE, num_warps=8,
    )
