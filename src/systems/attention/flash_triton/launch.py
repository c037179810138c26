"""Host side of the FlashAttention-2 kernels: input checks, tile configs and launches."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import torch
import triton

from systems.attention.flash_triton.kernels import (
    flash_backward_dkdv_kernel,
    flash_backward_dq_kernel,
    flash_forward_kernel,
)
from systems.attention.inputs import check_attention_inputs
from systems.triton_launcher import KernelLauncher, PlannedDescriptor
from systems.triton_runtime import INTERPRETED

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

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
# Head dims between the powers of two pad to the next one (d = 80 runs 128-column tiles),
# and for the one such dim measured, the 2.7b model's 80, narrower key tiles won at its
# in-model sizes (bf16, causal, 128 matrices x 512 and x 2048 rows, the tune module on an
# H100; runs in scripts/attention_tune_runs/2026-11-23/). Keyed by the head dim itself.
_HALF_HEAD_DIM_CONFIGS: dict[int, FlashConfig] = {
    80: _tiles((128, 32, 4, 3), (128, 32, 4, 3), (32, 64, 4, 3)),
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
    return _HALF_HEAD_DIM_CONFIGS.get(head_dim) or _HALF_CONFIGS[padded]


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_triton_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Everything `check_attention_inputs` asks, plus what these kernels need. The checks
    that shapes, dtypes and devices decide run once per such signature."""
    signature = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                 q.device, k.device, v.device)
    if signature not in _CHECKED_SIGNATURES:
        _check_signature(q, k, v)
        if len(_CHECKED_SIGNATURES) >= _MAX_CHECKED_SIGNATURES:
            _CHECKED_SIGNATURES.clear()
        _CHECKED_SIGNATURES.add(signature)


_CHECKED_SIGNATURES: set[tuple[object, ...]] = set()
_MAX_CHECKED_SIGNATURES = 4096


def _check_signature(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
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


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 runs each dot as three TF32 tensor-core products (hi*hi + hi*lo + lo*hi), which
    # keeps fp32-level error where one TF32 product would cost ~1e-3; FMA-unit ("ieee")
    # dots were 2-7x slower than PyTorch's fp32 reference at d >= 64.
    return "tf32x3" if dtype == torch.float32 else "tf32"


# Output buffers: every element is written by a kernel (tests poison them through these).
def _empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty_like(t, dtype=dtype)  # several times cheaper on the host than empty


def _new_empty(like: torch.Tensor, shape: tuple[int, ...],
               dtype: torch.dtype | None = None) -> torch.Tensor:
    return like.new_empty(shape, dtype=dtype)


def _descriptor_head_dim(d: int, dtype: torch.dtype) -> int:
    """d rounded up so that a row is a multiple of 16 bytes, as TMA descriptors need."""
    per_16_bytes = 16 // dtype.itemsize
    return -(-d // per_16_bytes) * per_16_bytes


MatrixStrides = tuple[int, int, int]  # (batch, head, seq) strides, in elements


def _matrix_dims(shape: torch.Size) -> tuple[int, int]:
    """(B, H): a (..., seq, d) shape's leading dims as batch x heads (outer ones merged)."""
    if len(shape) == 2:
        return 1, 1
    return math.prod(shape[:-3]), shape[-3]


@functools.lru_cache(maxsize=4096)
def _matrix_strides(shape: torch.Size, strides: tuple[int, ...], itemsize: int,
                    head_dim: int) -> MatrixStrides | None:
    """The (batch, head, seq) strides of a tensor of this shape and strides seen as
    (B, H, seq, head_dim) matrices (`_matrix_dims`), or None when the kernels cannot read
    or write it in place: rows must be head_dim unit-stride elements, the batch dims must
    merge into one, and every stride must be a positive multiple of 16 bytes (TMA's rule).
    A dim of size 1 takes its packed stride: no address uses it, but TMA checks it."""
    if shape[-1] != head_dim or strides[-1] != 1:
        return None
    seq, stride_s = shape[-2], strides[-2]
    heads, stride_h = (shape[-3], strides[-3]) if len(shape) > 2 else (1, 0)
    batch = [(n, step) for n, step in zip(shape[:-3], strides[:-3], strict=True)
             if n != 1]
    if any(outer != inner * n for (_, outer), (n, inner) in itertools.pairwise(batch)):
        return None
    stride_b = batch[-1][1] if batch else 0
    if seq == 1:
        stride_s = head_dim
    if heads == 1:
        stride_h = stride_s * seq
    if not batch:
        stride_b = stride_h * heads
    merged = (stride_b, stride_h, stride_s)
    per_16_bytes = 16 // itemsize
    if any(step <= 0 or step % per_16_bytes for step in merged):
        return None
    return merged


Operand = tuple[torch.Tensor, MatrixStrides]  # a tensor the kernels read, its strides


def _readable(t: torch.Tensor, head_dim: int, itemsize: int) -> Operand:
    """(t, its matrix strides) when the kernels can read t in place (16-byte aligned start:
    every pointer a launcher sees is aligned, see `KernelLauncher`), else the same for a
    zero-padded packed copy (pad columns add 0 to every score and produce output columns
    that are cut off)."""
    strides = _matrix_strides(t.shape, t.stride(), itemsize, head_dim)
    if strides is not None and t.data_ptr() % 16 == 0:
        return t, strides
    padded = t.new_zeros(*t.shape[:-1], head_dim)
    padded[..., :t.shape[-1]] = t
    return padded, _matrix_strides(padded.shape, padded.stride(), itemsize, head_dim)


class _Output:
    """An output shaped and laid out like `like` (as the ops' fake versions promise), and
    the buffer the kernel writes: the output itself when the kernels can write that layout,
    else a padded packed buffer whose first d columns `result()` copies into it."""

    def __init__(self, like: torch.Tensor, head_dim: int, itemsize: int) -> None:
        self.tensor = _empty_like(like)
        self.buffer, self.strides = self.tensor, _matrix_strides(
            self.tensor.shape, self.tensor.stride(), itemsize, head_dim)
        if self.strides is None:
            self.buffer = _new_empty(like, (*like.shape[:-1], head_dim))
            self.strides = _matrix_strides(self.buffer.shape, self.buffer.stride(), itemsize,
                                           head_dim)

    def result(self) -> torch.Tensor:
        if self.buffer is not self.tensor:
            self.tensor.copy_(self.buffer[..., :self.tensor.shape[-1]])
        return self.tensor


@dataclass(frozen=True)
class _Problem:
    """One attention problem's launches. Shapes, dtype, device, mask and tiles fix most of
    what Triton specialises on; the tensors' strides fix the rest, so each kernel has one
    launcher per problem and strides (`KernelLauncher`: compiled once, launched directly)."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    d: int
    dtype: torch.dtype
    device: torch.device
    is_causal: bool
    config: FlashConfig
    launchers: dict[tuple[object, ...], KernelLauncher] = field(
        default_factory=dict, compare=False, hash=False, repr=False)

    @functools.cached_property
    def head_dim(self) -> int:
        return _descriptor_head_dim(self.d, self.dtype)

    @functools.cached_property
    def block_d(self) -> int:
        return _next_power_of_2(self.head_dim)

    @functools.cached_property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def readable(self, *tensors: torch.Tensor) -> list[Operand]:
        head_dim, itemsize = self.head_dim, self.itemsize
        return [_readable(t, head_dim, itemsize) for t in tensors]

    def output(self, like: torch.Tensor) -> _Output:
        return _Output(like, self.head_dim, self.itemsize)

    def _tiles(self, operand: Operand, seq: int, block_rows: int) -> PlannedDescriptor:
        """A descriptor reading block_rows x BLOCK_D tiles of one matrix of the operand."""
        base, strides = operand
        return PlannedDescriptor(base, (self.batch, self.heads, seq, self.head_dim),
                                 (*strides, 1), [1, 1, block_rows, self.block_d])

    def _launcher(self, kernel: triton.JITFunction, tiles: TileConfig, seq: int, block: int,
                  strides: tuple[MatrixStrides, ...], **constexprs: object) -> KernelLauncher:
        """The kernel over a (matrices, tiles of `block` rows of `seq`) grid, for tensors
        of these strides."""
        key = (kernel, strides)
        launcher = self.launchers.get(key)
        if launcher is None:
            launcher = self.launchers[key] = KernelLauncher(
                kernel, (self.batch * self.heads, _cdiv(seq, block)),
                {"SM_SCALE": self.d ** -0.5, "HEAD_DIM": self.head_dim,
                 "BLOCK_D": self.block_d, "BLOCK_M": tiles.block_m,
                 "BLOCK_N": tiles.block_n, "IS_CAUSAL": self.is_causal, **constexprs,
                 "DOT_PRECISION": dot_precision(self.dtype)},
                num_warps=tiles.num_warps, num_stages=tiles.num_stages,
                device_index=self.device.index or 0)
        return launcher

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        tiles = self.config.forward
        o = self.output(q)
        lse = _new_empty(q, q.shape[:-1], torch.float32)
        q, k, v = self.readable(q, k, v)
        launch = self._launcher(flash_forward_kernel, tiles, self.n_q, tiles.block_m,
                                (q[1], k[1], v[1], o.strides))
        launch(q[0], *q[1], self._tiles(k, self.n_k, tiles.block_n),
               self._tiles(v, self.n_k, tiles.block_n), o.buffer, *o.strides, lse,
               self.heads, self.n_q, self.n_k)
        return o.result(), lse

    def backward_dq(self, like_q: torch.Tensor, q: Operand, k: Operand, v: Operand,
                    o: Operand, lse: torch.Tensor, do: Operand, tiles: TileConfig
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(dq laid out like `like_q`, D) from readable operands."""
        dq, delta = self.output(like_q), _empty_like(lse)
        launch = self._launcher(flash_backward_dq_kernel, tiles, self.n_q, tiles.block_m,
                                (q[1], k[1], v[1], o[1], do[1], dq.strides))
        launch(q[0], *q[1], self._tiles(k, self.n_k, tiles.block_n),
               self._tiles(v, self.n_k, tiles.block_n), o[0], *o[1], do[0], *do[1], lse,
               delta, dq.buffer, *dq.strides, self.heads, self.n_q, self.n_k)
        return dq.result(), delta

    def backward_dkdv(self, like_k: torch.Tensor, like_v: torch.Tensor, q: Operand,
                      k: Operand, v: Operand, do: Operand, lse: torch.Tensor,
                      delta: torch.Tensor, tiles: TileConfig
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """(dk, dv) laid out like `like_k` and `like_v`, from readable operands."""
        dk, dv = self.output(like_k), self.output(like_v)
        # Its programs walk key tiles; the last query tile is partial unless block_m
        # divides n_q.
        launch = self._launcher(flash_backward_dkdv_kernel, tiles, self.n_k, tiles.block_n,
                                (q[1], k[1], v[1], do[1], dk.strides, dv.strides),
                                CHECK_Q_ROWS=self.n_q % tiles.block_m != 0)
        launch(self._tiles(q, self.n_q, tiles.block_m), k[0], *k[1], v[0], *v[1],
               self._tiles(do, self.n_q, tiles.block_m), lse, delta, dk.buffer, *dk.strides,
               dv.buffer, *dv.strides, self.heads, self.n_q, self.n_k)
        return dk.result(), dv.result()


@functools.lru_cache(maxsize=1024)
def _problem(batch: int, heads: int, n_q: int, n_k: int, d: int, dtype: torch.dtype,
             device: torch.device, is_causal: bool, config: FlashConfig | None) -> _Problem:
    config = config or default_config(d, dtype, batch * heads * _cdiv(n_q, 128), device)
    return _Problem(batch, heads, n_q, n_k, d, dtype, device, is_causal, config)


def _problem_of(q: torch.Tensor, k: torch.Tensor, is_causal: bool,
                config: FlashConfig | None) -> _Problem:
    shape = q.shape
    return _problem(*_matrix_dims(shape), shape[-2], k.shape[-2], shape[-1], q.dtype,
                    q.device, is_causal, config)


def flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
    config: FlashConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) for checked inputs; o is laid out like q (`torch.empty_like`), L is the
    natural-log log-sum-exp, fp32, (..., n_queries), packed."""
    return _problem_of(q, k, is_causal, config).forward(q, k, v)


def flash_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool = False, config: FlashConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), each laid out like its input: a dQ pass over query tiles (it also
    writes D), then a dK/dV pass. lse must be flash_forward's (packed, freshly allocated,
    so 16-byte aligned); do may have any strides (autograd may hand over an expanded or
    transposed gradient)."""
    problem = _problem_of(q, k, is_causal, config)
    q_in, k_in, v_in, o_in, do_in = problem.readable(q, k, v, o, do)
    dq, delta = problem.backward_dq(q, q_in, k_in, v_in, o_in, lse, do_in,
                                    problem.config.backward_dq)
    dk, dv = problem.backward_dkdv(k, v, q_in, k_in, v_in, do_in, lse, delta,
                                   problem.config.backward_dkdv)
    return dq, dk, dv


def backward_dq(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool, tiles: TileConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, D) with `tiles`, where D = rowsum(o * do), fp32, shaped like L (for tuning)."""
    problem = _problem_of(q, k, is_causal, FlashConfig(tiles, tiles, tiles))
    return problem.backward_dq(q, *problem.readable(q, k, v, o), lse,
                               *problem.readable(do), tiles)


def backward_dkdv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, is_causal: bool, tiles: TileConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dk, dv) with `tiles` (for tuning)."""
    problem = _problem_of(q, k, is_causal, FlashConfig(tiles, tiles, tiles))
    return problem.backward_dkdv(k, v, *problem.readable(q, k, v, do), lse, delta, tiles)
