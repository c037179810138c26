"""AdamW over fp32 master weights for many tensors in one Triton kernel launch.

Per element the kernel reads the gradient (any float dtype), the fp32 master weight and
both fp32 moments once, and writes the master, the moments and the low-precision parameter
the model computes with: the least an AdamW step over fp32 state can move. The math
follows `torch.optim.AdamW` (see `systems.optim.AdamW`). For bf16 parameters the master
can instead be held as the parameter plus int16 low bits (`systems.optim.split_master`):
the kernel then reads both halves, and writes both, 2 bytes per weight fewer.

One launch covers a whole list of tensors (one per tensor would cost more host time than
GPU time on small tensors): every program handles BLOCK_SIZE elements of one tensor, found
through a block table (tensor index, first element) built once per list of sizes, and the
tensors' addresses come in int64 tables rebuilt each step, since gradients are new tensors
every step.

Step counts are tensors on the device and the bias corrections are computed there, so a
step can be captured in a CUDA graph: each replay advances the counts and uses the new
corrections, where host-side numbers would be frozen at capture.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from systems.common.hardware import GpuTarget
from systems.kernel_runtime import interpreter  # sets TRITON_INTERPRET before the kernel exists
from systems.kernel_runtime.triton_build import build_for

# The kernel's tile on every GPU: it is element-wise (no shared memory, no tensor cores), so
# no GPU property bounds it but registers per block, 32 elements per thread at 4 warps,
# which `systems check-builds` holds against every target's.
BLOCK_SIZE = 4096
NUM_WARPS = 4
_TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16,
                  torch.float16: tl.float16}


@triton.jit
def _join_master(param, low):
    """fp32 from a bf16 parameter and its int16 low bits (`split_master.join_master`)."""
    high = param.to(tl.int16, bitcast=True).to(tl.int32) << 16
    return (high + low.to(tl.int32)).to(tl.float32, bitcast=True)


@triton.jit
def _split_master(master):
    """(bf16 parameter, int16 low bits) of an fp32 master (`split_master.split_master`)."""
    bits = master.to(tl.int32, bitcast=True)
    high = (bits + 0x8000) >> 16  # nearest, ties away from zero; overflows only for NaN
    low = bits - (high << 16)
    nan = master != master
    high = tl.where(nan, 0x7FC0, high).to(tl.int16)
    low = tl.where(nan, 0, low).to(tl.int16)
    return high.to(tl.bfloat16, bitcast=True), low


@triton.jit
def _adamw_update(param_ptr, grad_ptr, master_ptr, exp_avg_ptr, exp_avg_sq_ptr, offsets, mask,
                  step_size, bias_correction2_sqrt, lr, beta1, beta2, eps, weight_decay,
                  PARAM_DTYPE: tl.constexpr, SPLIT_MASTER: tl.constexpr):
    grad = tl.load(grad_ptr + offsets, mask=mask).to(tl.float32)
    if SPLIT_MASTER:  # master_ptr holds the low bits under the bf16 parameter
        master = _join_master(tl.load(param_ptr + offsets, mask=mask),
                              tl.load(master_ptr + offsets, mask=mask))
    else:
        master = tl.load(master_ptr + offsets, mask=mask)
    exp_avg = tl.load(exp_avg_ptr + offsets, mask=mask)
    exp_avg_sq = tl.load(exp_avg_sq_ptr + offsets, mask=mask)
    master = master * (1.0 - lr * weight_decay)
    exp_avg = exp_avg + (1.0 - beta1) * (grad - exp_avg)
    exp_avg_sq = exp_avg_sq * beta2 + (1.0 - beta2) * grad * grad
    denom = tl.sqrt(exp_avg_sq) / bias_correction2_sqrt + eps
    master = master - step_size * exp_avg / denom
    tl.store(exp_avg_ptr + offsets, exp_avg, mask=mask)
    tl.store(exp_avg_sq_ptr + offsets, exp_avg_sq, mask=mask)
    if SPLIT_MASTER:
        param, low = _split_master(master)
        tl.store(master_ptr + offsets, low, mask=mask)
        tl.store(param_ptr + offsets, param, mask=mask)
    else:
        tl.store(master_ptr + offsets, master, mask=mask)
        tl.store(param_ptr + offsets, master.to(PARAM_DTYPE, fp_downcast_rounding="rtne"),
                 mask=mask)


@triton.jit
def _tensor_pointer(addresses, row, num_tensors, tensor, DTYPE: tl.constexpr,
                    ALIGNED: tl.constexpr):
    pointer = tl.load(addresses + row * num_tensors + tensor).to(tl.pointer_type(DTYPE))
    if ALIGNED:  # the host checked: every address is a multiple of 16 bytes
        pointer = tl.multiple_of(pointer, 16)
    return pointer


@triton.jit
def _adamw_kernel(block_tensor, block_start, addresses, numels, num_tensors, corrections,
                  lr, beta1, beta2, eps, weight_decay,
                  PARAM_DTYPE: tl.constexpr, GRAD_DTYPE: tl.constexpr, ALIGNED: tl.constexpr,
                  SPLIT_MASTER: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    block = tl.program_id(0)
    tensor = tl.load(block_tensor + block)
    start = tl.multiple_of(tl.load(block_start + block), BLOCK_SIZE)
    offsets = start + tl.arange(0, BLOCK_SIZE)
    numel = tl.load(numels + tensor)
    # addresses: rows param, grad, master, exp_avg, exp_avg_sq; one column per tensor.
    param_ptr = _tensor_pointer(addresses, 0, num_tensors, tensor, PARAM_DTYPE, ALIGNED)
    grad_ptr = _tensor_pointer(addresses, 1, num_tensors, tensor, GRAD_DTYPE, ALIGNED)
    master_ptr = _tensor_pointer(addresses, 2, num_tensors, tensor,
                                 tl.int16 if SPLIT_MASTER else tl.float32, ALIGNED)
    exp_avg_ptr = _tensor_pointer(addresses, 3, num_tensors, tensor, tl.float32, ALIGNED)
    exp_avg_sq_ptr = _tensor_pointer(addresses, 4, num_tensors, tensor, tl.float32, ALIGNED)
    # corrections: rows lr / (1 - beta1^t) and sqrt(1 - beta2^t); one column per tensor.
    step_size = tl.load(corrections + tensor)
    bias_correction2_sqrt = tl.load(corrections + num_tensors + tensor)
    # Whole blocks go without a mask: with aligned addresses the compiler then moves 16
    # bytes per load and store instead of one element (a mask built from a size read at
    # run time would force element-wise accesses). Only each tensor's last block is masked.
    if start + BLOCK_SIZE <= numel:
        _adamw_update(param_ptr, grad_ptr, master_ptr, exp_avg_ptr, exp_avg_sq_ptr, offsets,
                      None, step_size, bias_correction2_sqrt, lr, beta1, beta2, eps,
                      weight_decay, PARAM_DTYPE, SPLIT_MASTER)
    else:
        _adamw_update(param_ptr, grad_ptr, master_ptr, exp_avg_ptr, exp_avg_sq_ptr, offsets,
                      offsets < numel, step_size, bias_correction2_sqrt, lr, beta1, beta2,
                      eps, weight_decay, PARAM_DTYPE, SPLIT_MASTER)


@functools.lru_cache(maxsize=64)
def _block_table(numels: tuple[int, ...], device: torch.device, block_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tensor index, first element) of every block, and the sizes, on `device`."""
    sizes = torch.tensor(numels, dtype=torch.int64)
    blocks = (sizes + block_size - 1) // block_size
    block_tensor = torch.repeat_interleave(torch.arange(len(numels)), blocks)
    first_block = torch.cumsum(blocks, 0) - blocks
    block_start = (torch.arange(int(blocks.sum())) - first_block[block_tensor]) * block_size
    return (block_tensor.to(torch.int32).to(device), block_start.to(device), sizes.to(device))


# Address tables copied while a CUDA graph was being captured: every replay of that graph
# copies from the same pinned host memory again, so it must never be freed or reused.
_CAPTURED_ADDRESS_TABLES: list[torch.Tensor] = []


def _address_table(tensors: list[torch.Tensor], device: torch.device
                   ) -> tuple[torch.Tensor, bool]:
    """The tensors' addresses on `device`, and whether all are multiples of 16 bytes."""
    pointers = [t.data_ptr() for t in tensors]
    aligned = all(pointer % 16 == 0 for pointer in pointers)
    addresses = torch.tensor(pointers, dtype=torch.int64)
    if device.type != "cuda":
        return addresses, aligned
    addresses = addresses.pin_memory()  # pinned: the copy is queued without waiting
    if torch.cuda.is_current_stream_capturing():
        _CAPTURED_ADDRESS_TABLES.append(addresses)
    return addresses.to(device, non_blocking=True), aligned


def _bias_corrections(steps: torch.Tensor, lr: float, beta1: float,
                      beta2: float) -> torch.Tensor:
    """(2, tensors) float32: lr / (1 - beta1^t) and sqrt(1 - beta2^t), computed in float64
    from the float64 `steps` and rounded once, as a Python float argument would be."""
    step_size = lr / (1.0 - torch.pow(beta1, steps))
    bias_correction2_sqrt = torch.sqrt(1.0 - torch.pow(beta2, steps))
    return torch.stack((step_size, bias_correction2_sqrt)).to(torch.float32)


def _check(params: Sequence[torch.Tensor], tensors: dict[str, Sequence[torch.Tensor]]) -> None:
    dtypes = {(p.dtype, g.dtype) for p, g in zip(params, tensors["grad"], strict=True)}
    if len(dtypes) != 1:
        raise ValueError(f"one launch takes one parameter and one gradient dtype, got {dtypes}")
    masters = tensors["master"]
    split = bool(masters) and params[0].dtype == torch.bfloat16 and masters[0].dtype == torch.int16
    for name, group in tensors.items():
        if len(group) != len(params):
            raise ValueError(f"{len(group)} {name} tensors for {len(params)} parameters")
        for param, tensor in zip(params, group, strict=True):
            wanted = torch.int16 if name == "master" and split else torch.float32
            if name != "grad" and tensor.dtype != wanted:
                raise ValueError(f"{name} must be float32 (or, for bf16 parameters, all "
                                 f"int16 low bits), got {tensor.dtype}")
            if (tensor.shape != param.shape or not tensor.is_contiguous()
                    or tensor.device != param.device):
                raise ValueError(f"{name} must be contiguous, on {param.device}, with shape "
                                 f"{tuple(param.shape)}")
    for param in params:
        if not param.is_contiguous():
            raise ValueError("parameters must be contiguous")
    device = params[0].device
    if device.type != "cuda" and not interpreter.INTERPRETED:
        raise ValueError(f"the fused AdamW kernel needs CUDA tensors, got {device} (set "
                         "TRITON_INTERPRET=1 before importing systems to run it on the CPU)")
    if any(p.device != device for p in params):
        raise ValueError("all parameters of one launch must be on one device")


def fused_adamw_step_(
    params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
    masters: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor], *, step: int, lr: float, beta1: float,
    beta2: float, eps: float, weight_decay: float,
) -> None:
    """AdamW step number `step` (from 1) of every tensor in the lists: update the fp32
    `masters` and moments in place and write each new master, rounded, into its parameter.
    For bf16 parameters `masters` may instead be int16 low bits, the master being the
    parameter and its low bits (`systems.optim.split_master`); both are then updated.
    All tensors contiguous and on one device; one parameter dtype and one gradient dtype."""
    if not params:
        return
    if step < 1:
        raise ValueError(f"step counts from 1, got {step}")
    _check(params, {"grad": grads, "master": masters, "exp_avg": exp_avgs,
                    "exp_avg_sq": exp_avg_sqs})
    steps = torch.full((len(params),), float(step), dtype=torch.float64,
                       device=params[0].device)
    launch_fused_adamw_(params, grads, masters, exp_avgs, exp_avg_sqs, steps=steps, lr=lr,
                        beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)


def launch_fused_adamw_(
    params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
    masters: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor], *, steps: torch.Tensor, lr: float, beta1: float,
    beta2: float, eps: float, weight_decay: float, block_size: int = BLOCK_SIZE,
    num_warps: int = NUM_WARPS,
) -> None:
    """`fused_adamw_step_` without its checks, for callers whose tensors are valid by
    construction (the checks cost host time per tensor and step). `steps`: each tensor's
    step number (from 1), float64 on the parameters' device. `block_size` (a power of two)
    and `num_warps` are the kernel's tile, for tuning: every choice computes the same bits."""
    device = params[0].device
    block_tensor, block_start, numels = _block_table(tuple(p.numel() for p in params), device,
                                                     block_size)
    addresses, aligned = _address_table(
        [t for group in (params, grads, masters, exp_avgs, exp_avg_sqs) for t in group], device)
    _adamw_kernel[(len(block_tensor),)](
        block_tensor, block_start, addresses, numels, len(params),
        _bias_corrections(steps, lr, beta1, beta2), lr, beta1, beta2, eps, weight_decay,
        PARAM_DTYPE=_TRITON_DTYPES[params[0].dtype],
        GRAD_DTYPE=_TRITON_DTYPES[grads[0].dtype], ALIGNED=aligned,
        SPLIT_MASTER=masters[0].dtype == torch.int16, BLOCK_SIZE=block_size,
        num_warps=num_warps,
    )


def build(target: GpuTarget) -> dict[str, dict[str, int | list[int]]]:
    """The kernel built for `target` at its tile (TRITON_INTERPRET=0), by launch it
    specialises to: bf16 and fp16 parameters and gradients, bf16 parameters over split
    masters, each with addresses aligned or not (`ALIGNED`)."""
    pointers = {"block_tensor": "*i32", "block_start": "*i64", "addresses": "*i64",
                "numels": "*i64", "corrections": "*fp32"}
    scalars = {"num_tensors": "i32", **dict.fromkeys(
        ("lr", "beta1", "beta2", "eps", "weight_decay"), "fp32")}
    built = {}
    for name, dtype, split in (("bf16", tl.bfloat16, False), ("fp16", tl.float16, False),
                               ("bf16-split", tl.bfloat16, True)):
        for aligned in (True, False):
            constexprs = {"PARAM_DTYPE": dtype, "GRAD_DTYPE": dtype, "ALIGNED": aligned,
                          "SPLIT_MASTER": split, "BLOCK_SIZE": BLOCK_SIZE}
            signature = {**pointers, **scalars, **dict.fromkeys(constexprs, "constexpr")}
            built[f"{name}{'' if aligned else '-unaligned'}"] = build_for(
                target, _adamw_kernel, signature, constexprs, num_warps=NUM_WARPS,
                num_stages=3)
    return built
