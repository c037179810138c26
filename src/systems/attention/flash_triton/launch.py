"""Host side of the FlashAttention-2 kernels: input checks, tile configs and launches."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from systems.attention.flash_triton.kernels import (
    flash_backward_dkdv_kernel,
    flash_backward_dq_kernel,
    flash_forward_kernel,
)
from systems.attention.inputs import check_attention_inputs
from systems.triton_launcher import CachedLauncher
from systems.triton_runtime import INTERPRETED

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_launch_forward = CachedLauncher(flash_forward_kernel)
_launch_dq = CachedLauncher(flash_backward_dq_kernel)
_launch_dkdv = CachedLauncher(flash_backward_dkdv_kernel)


# Plain-int helpers: triton.cdiv and triton.next_power_of_2 are constexpr functions whose
# host-side calls cost microseconds each, several times per attention call.
def _cdiv(n: int, block: int) -> int:
    return -(-n // block)


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class TileConfig:
    """One kernel's launch shape. block_m tiles queries, block_n tiles keys."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class FlashConfig:
    forward: TileConfig
    backward_dq: TileConfig
    backward_dkdv: TileConfig


def _tiles(forward: tuple[int, ...], dq: tuple[int, ...], dkdv: tuple[int, ...]) -> FlashConfig:
    return FlashConfig(TileConfig(*forward), TileConfig(*dq), TileConfig(*dkdv))


# (block_m, block_n, num_warps, num_stages) for the forward, dQ and dK/dV kernels, keyed by
# the padded head dim. Chosen with `python -m systems.attention.flash_triton.tune` on an
# H100 80GB HBM3 (bf16, causal, 16 x 16384 x d, d = 64 and 128); fp16 shares them, and
# d = 16 and 32 take d = 64's. dQ at d <= 64 was re-tuned after the TMA descriptors: one
# warpgroup beat two in each of five interleaved leaderboard rounds (4.98 vs 5.04 ms).
_HALF_CONFIGS: dict[int, FlashConfig] = {
    16: _tiles((128, 128, 4, 3), (128, 64, 4, 3), (32, 128, 4, 5)),
    32: _tiles((128, 128, 4, 3), (128, 64, 4, 3), (32, 128, 4, 5)),
    64: _tiles((128, 128, 4, 3), (128, 64, 4, 3), (32, 128, 4, 5)),
    128: _tiles((128, 128, 8, 3), (128, 64, 8, 3), (64, 128, 8, 3)),
}
# fp32 runs its dots as three TF32 products (`dot_precision`), whose operand splits take
# several times the shared memory of a half-precision tile: at d = 128 only small tiles
# fit. Chosen with the tune module on an H100 (fp32, full mask, 8 x 4096 x d).
_FP32_LARGE_TILES = _tiles((128, 64, 8, 3), (128, 64, 8, 3), (64, 128, 8, 2))
_FP32_CONFIGS: dict[int, FlashConfig] = {
    16: _FP32_LARGE_TILES,
    32: _FP32_LARGE_TILES,
    64: _FP32_LARGE_TILES,
    128: _tiles((128, 32, 4, 2), (32, 32, 4, 2), (32, 32, 4, 2)),
}


# Half precision when the problem is too small to fill the GPU with the tiles above (see
# `default_config`): 64-row query tiles and 64-key dK/dV tiles double the programs, and
# halve the longest one's work under the causal mask.
_HALF_FEW_PROGRAM_CONFIG = _tiles((64, 64, 4, 3), (64, 64, 4, 3), (32, 64, 4, 3))
# Fewer (matrices x 128-row query tiles) than this many per SM count as a small problem,
# keyed by the padded head dim (measured on an H100 at batch 1, seq 4096..65536: at d = 128
# the default tiles win again from 2 programs per SM).
_FEW_PROGRAMS_PER_SM = {16: 2, 32: 2, 64: 2, 128: 1}


def default_config(head_dim: int, dtype: torch.dtype, programs: int | None = None,
                   device: torch.device | None = None) -> FlashConfig:
    """The tiles for this head dim and dtype. `programs`, the number of (matrix x 128-row
    query tile) pairs, picks smaller half-precision tiles when it would leave SMs idle."""
    padded = _next_power_of_2(head_dim)
    if dtype == torch.float32:
        return _FP32_CONFIGS[padded]
    on_gpu = programs is not None and device is not None and device.type == "cuda"
    if on_gpu and programs < _FEW_PROGRAMS_PER_SM[padded] * _sm_count(device):
        return _HALF_FEW_PROGRAM_CONFIG
    return _HALF_CONFIGS[padded]


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _programs(q: torch.Tensor) -> int:
    return _rows(q) * _cdiv(q.shape[-2], 128)


def check_triton_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Everything `check_attention_inputs` asks, plus what these kernels need."""
    check_attention_inputs(q, k, v)
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {q.dtype} unsupported; use one of {SUPPORTED_DTYPES}")
    if INTERPRETED and q.dtype == torch.bfloat16:
        raise ValueError("bf16 is unsupported under TRITON_INTERPRET=1 (its interpreter "
                         "computes bf16 dots wrongly); run bf16 on a GPU")
    if not MIN_HEAD_DIM <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {q.shape[-1]} unsupported; need "
                         f"{MIN_HEAD_DIM} <= d <= {MAX_HEAD_DIM}")
    if not INTERPRETED and q.device.type != "cuda":
        raise ValueError(f"the Triton kernels need CUDA tensors, got {q.device} (set "
                         "TRITON_INTERPRET=1 before importing systems to run them on the CPU)")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous (call .contiguous() first)")


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 runs each dot as three TF32 tensor-core products (hi*hi + hi*lo + lo*hi), which
    # keeps fp32-level error where one TF32 product would cost ~1e-3; FMA-unit ("ieee")
    # dots were 2-7x slower than PyTorch's fp32 reference at d >= 64.
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _empty(shape: torch.Size | tuple[int, ...], like: torch.Tensor,
           dtype: torch.dtype | None = None) -> torch.Tensor:
    """Output buffers: every element is written by a kernel (tests poison this)."""
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)


def _descriptor_head_dim(d: int, dtype: torch.dtype) -> int:
    """d rounded up so that a row is a multiple of 16 bytes, as TMA descriptors need."""
    per_16_bytes = 16 // dtype.itemsize
    return -(-d // per_16_bytes) * per_16_bytes


def _for_descriptors(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """t itself when TMA can read it; else a 16-byte-aligned copy zero-padded to head_dim
    (pad columns add 0 to every score and produce output columns that are cut off)."""
    # A tensor traced by torch.compile has neither an address nor a traceable offset, so it
    # is taken as aligned: compiled graphs allocate their own buffers aligned, and a view
    # starting off a 16-byte boundary is unsupported there (untested: the TMA descriptor
    # encoding is expected to reject its address).
    aligned = torch.compiler.is_compiling() or t.data_ptr() % 16 == 0
    if t.shape[-1] == head_dim and aligned:
        return t
    padded = t.new_zeros(*t.shape[:-1], head_dim)
    padded[..., :t.shape[-1]] = t
    return padded


def _tiles_of(t: torch.Tensor, rows: int, block_d: int) -> TensorDescriptor:
    """A descriptor reading `rows` x block_d tiles of t's matrices (t as (BH, seq, d))."""
    return TensorDescriptor.from_tensor(t.view(-1, t.shape[-2], t.shape[-1]),
                                        [1, rows, block_d])


def _cut_to(t: torch.Tensor, d: int) -> torch.Tensor:
    """t without the pad columns `_for_descriptors` added."""
    return t if t.shape[-1] == d else t[..., :d].contiguous()


def _for_kernels(d: int, *tensors: torch.Tensor
                 ) -> tuple[list[torch.Tensor], dict[str, object]]:
    """The tensors as the kernels read them (`_for_descriptors`), and the compile-time
    constants for their head dim once padded to 16-byte rows."""
    dtype = tensors[0].dtype
    head_dim = _descriptor_head_dim(d, dtype)
    common = {"HEAD_DIM": head_dim, "BLOCK_D": _next_power_of_2(head_dim),
              "DOT_PRECISION": dot_precision(dtype)}
    return [_for_descriptors(t, head_dim) for t in tensors], common


def _head_dim(t: torch.Tensor) -> int:
    """t's head dim as an int. Under torch.compile a dim that changed between calls arrives
    symbolic (and int() keeps it so), but the kernels take it as a compile-time constant:
    branching on its value makes Dynamo guard on it and hand back a plain int."""
    d = t.shape[-1]
    if torch.compiler.is_compiling():
        for value in range(MIN_HEAD_DIM, MAX_HEAD_DIM + 1):
            if d == value:
                return value
    return d


def _rows(t: torch.Tensor) -> int:
    """Number of (batch x heads) matrices in t of shape (..., seq, d)."""
    return math.prod(t.shape[:-2])


def flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
    config: FlashConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) for checked inputs; L is the natural-log log-sum-exp, fp32, (..., n_queries)."""
    n_q, n_k, d = q.shape[-2], k.shape[-2], _head_dim(q)
    tiles = (config or default_config(d, q.dtype, _programs(q), q.device)).forward
    (q, k, v), common = _for_kernels(d, q, k, v)
    o = _empty(q.shape, q)
    lse = _empty(q.shape[:-1], q, torch.float32)
    block_d = common["BLOCK_D"]
    _launch_forward(
        (_rows(q), _cdiv(n_q, tiles.block_m)),
        q, _tiles_of(k, tiles.block_n, block_d), _tiles_of(v, tiles.block_n, block_d), o, lse,
        n_q, n_k, d ** -0.5, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, CAUSAL=is_causal,
        **common, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return _cut_to(o, d), lse


def flash_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool = False, config: FlashConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): a dQ pass over query tiles (it also writes D), then a dK/dV pass."""
    config = config or default_config(_head_dim(q), q.dtype, _programs(q), q.device)
    do = do.contiguous()  # autograd may hand over an expanded or strided gradient
    dq, delta = backward_dq(q, k, v, o, lse, do, is_causal, config.backward_dq)
    dk, dv = backward_dkdv(q, k, v, do, lse, delta, is_causal, config.backward_dkdv)
    return dq, dk, dv


def backward_dq(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool, tiles: TileConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, D) where D = rowsum(o * do), fp32, shaped like L."""
    n_q, n_k, d = q.shape[-2], k.shape[-2], _head_dim(q)
    (q, k, v, o, do), common = _for_kernels(d, q, k, v, o, do)
    dq, delta = _empty(q.shape, q), _empty(lse.shape, lse)
    _launch_dq(
        (_rows(q), _cdiv(n_q, tiles.block_m)),
        q, *(_tiles_of(t, tiles.block_n, common["BLOCK_D"]) for t in (k, v)), o, do, lse, delta,
        dq, n_q, n_k, d ** -0.5, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        CAUSAL=is_causal, **common, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return _cut_to(dq, d), delta


def backward_dkdv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, is_causal: bool, tiles: TileConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    n_q, n_k, d = q.shape[-2], k.shape[-2], _head_dim(q)
    (q, k, v, do), common = _for_kernels(d, q, k, v, do)
    dk, dv = _empty(k.shape, k), _empty(v.shape, v)
    q_tiles, do_tiles = (_tiles_of(t, tiles.block_m, common["BLOCK_D"]) for t in (q, do))
    _launch_dkdv(
        (_rows(q), _cdiv(n_k, tiles.block_n)),
        q_tiles, k, v, do_tiles, lse, delta, dk, dv, n_q, n_k, d ** -0.5,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, CAUSAL=is_causal,
        CHECK_Q_ROWS=bool(n_q % tiles.block_m != 0), **common,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return _cut_to(dk, d), _cut_to(dv, d)
