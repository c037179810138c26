"""Host side of the FlashAttention-2 kernels: input checks, tile configs and launches."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

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
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        name = next(n for n, t in (("q", q), ("k", k), ("v", v)) if not t.is_contiguous())
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")


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


# Output buffers: every element is written by a kernel (tests poison these two).
def _empty(shape: torch.Size | tuple[int, ...], like: torch.Tensor,
           dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t)  # several times cheaper on the host than torch.empty


def _descriptor_head_dim(d: int, dtype: torch.dtype) -> int:
    """d rounded up so that a row is a multiple of 16 bytes, as TMA descriptors need."""
    per_16_bytes = 16 // dtype.itemsize
    return -(-d // per_16_bytes) * per_16_bytes


def _for_kernels(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """t itself when the kernels can read it: rows of head_dim elements and a 16-byte
    aligned start (every pointer a launcher sees is aligned, see `KernelLauncher`). Else a
    zero-padded copy (pad columns add 0 to every score and produce output columns that are
    cut off)."""
    if t.shape[-1] == head_dim and t.data_ptr() % 16 == 0:
        return t
    padded = t.new_zeros(*t.shape[:-1], head_dim)
    padded[..., :t.shape[-1]] = t
    return padded


def _cut_to(t: torch.Tensor, d: int) -> torch.Tensor:
    """t without the pad columns `_for_kernels` added."""
    return t if t.shape[-1] == d else t[..., :d].contiguous()


@dataclass(frozen=True)
class _Problem:
    """One attention problem's launches. Shapes, dtype, device, mask and tiles fix what
    Triton specialises on, so each problem's kernels compile once and later calls launch
    them directly (`KernelLauncher`)."""

    rows: int
    n_q: int
    n_k: int
    d: int
    dtype: torch.dtype
    device: torch.device
    is_causal: bool
    config: FlashConfig

    @functools.cached_property
    def head_dim(self) -> int:
        return _descriptor_head_dim(self.d, self.dtype)

    def _launcher(self, kernel: triton.JITFunction, tiles: TileConfig, seq: int, block: int,
                  **constexprs: object) -> KernelLauncher:
        """The kernel over a (matrices, tiles of `block` rows of `seq`) grid."""
        return KernelLauncher(
            kernel, (self.rows, _cdiv(seq, block)),
            {"SM_SCALE": self.d ** -0.5, "HEAD_DIM": self.head_dim,
             "BLOCK_D": _next_power_of_2(self.head_dim), "BLOCK_M": tiles.block_m,
             "BLOCK_N": tiles.block_n, "IS_CAUSAL": self.is_causal, **constexprs,
             "DOT_PRECISION": dot_precision(self.dtype)},
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
            device_index=self.device.index or 0)

    @functools.cached_property
    def forward(self) -> KernelLauncher:
        tiles = self.config.forward
        return self._launcher(flash_forward_kernel, tiles, self.n_q, tiles.block_m)

    @functools.cached_property
    def dq(self) -> KernelLauncher:
        tiles = self.config.backward_dq
        return self._launcher(flash_backward_dq_kernel, tiles, self.n_q, tiles.block_m)

    @functools.cached_property
    def dkdv(self) -> KernelLauncher:
        # Its programs walk key tiles; the last query tile is partial unless block_m divides
        # n_q.
        tiles = self.config.backward_dkdv
        return self._launcher(flash_backward_dkdv_kernel, tiles, self.n_k, tiles.block_n,
                              CHECK_Q_ROWS=self.n_q % tiles.block_m != 0)

    def _layout(self, seq: int, block_rows: int) -> tuple[object, ...]:
        """(shape, strides, block shape) of a descriptor reading block_rows x BLOCK_D tiles
        of a (rows, seq, head_dim) tensor."""
        head_dim = self.head_dim
        return ((self.rows, seq, head_dim), (seq * head_dim, head_dim, 1),
                [1, block_rows, _next_power_of_2(head_dim)])

    @functools.cached_property
    def key_tiles(self) -> dict[str, tuple[object, ...]]:
        """Descriptor layouts of k and v for the forward and dQ kernels."""
        return {"forward": self._layout(self.n_k, self.config.forward.block_n),
                "dq": self._layout(self.n_k, self.config.backward_dq.block_n)}

    @functools.cached_property
    def query_tiles(self) -> tuple[object, ...]:
        """Descriptor layout of q and do for the dK/dV kernel."""
        return self._layout(self.n_q, self.config.backward_dkdv.block_m)


@functools.lru_cache(maxsize=1024)
def _problem(rows: int, n_q: int, n_k: int, d: int, dtype: torch.dtype, device: torch.device,
             is_causal: bool, config: FlashConfig | None) -> _Problem:
    config = config or default_config(d, dtype, rows * _cdiv(n_q, 128), device)
    return _Problem(rows, n_q, n_k, d, dtype, device, is_causal, config)


def _problem_of(q: torch.Tensor, k: torch.Tensor, is_causal: bool,
                config: FlashConfig | None) -> _Problem:
    shape = q.shape
    return _problem(math.prod(shape[:-2]), shape[-2], k.shape[-2], shape[-1], q.dtype,
                    q.device, is_causal, config)


def flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
    config: FlashConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) for checked inputs; L is the natural-log log-sum-exp, fp32, (..., n_queries)."""
    problem = _problem_of(q, k, is_causal, config)
    head_dim, layout = problem.head_dim, problem.key_tiles["forward"]
    q, k, v = (_for_kernels(t, head_dim) for t in (q, k, v))
    o = _empty_like(q)
    lse = _empty(q.shape[:-1], q, torch.float32)
    problem.forward(q, PlannedDescriptor(k, *layout), PlannedDescriptor(v, *layout), o, lse,
                    problem.n_q, problem.n_k)
    return _cut_to(o, problem.d), lse


def flash_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool = False, config: FlashConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): a dQ pass over query tiles (it also writes D), then a dK/dV pass.
    lse must be flash_forward's (contiguous, freshly allocated, so 16-byte aligned)."""
    problem = _problem_of(q, k, is_causal, config)
    head_dim = problem.head_dim
    # autograd may hand over an expanded or strided gradient
    q, k, v, o, do = (_for_kernels(t, head_dim) for t in (q, k, v, o, do.contiguous()))
    dq, delta = _backward_dq(problem, q, k, v, o, lse, do)
    dk, dv = _backward_dkdv(problem, q, k, v, do, lse, delta)
    return _cut_to(dq, problem.d), _cut_to(dk, problem.d), _cut_to(dv, problem.d)


def _backward_dq(problem: _Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    layout = problem.key_tiles["dq"]
    dq, delta = _empty_like(q), _empty_like(lse)
    problem.dq(q, PlannedDescriptor(k, *layout), PlannedDescriptor(v, *layout), o, do, lse,
               delta, dq, problem.n_q, problem.n_k)
    return dq, delta


def _backward_dkdv(problem: _Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   do: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    layout = problem.query_tiles
    dk, dv = _empty_like(k), _empty_like(v)
    problem.dkdv(PlannedDescriptor(q, *layout), k, v, PlannedDescriptor(do, *layout), lse,
                 delta, dk, dv, problem.n_q, problem.n_k)
    return dk, dv


def backward_dq(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool, tiles: TileConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, D) with `tiles`, where D = rowsum(o * do), fp32, shaped like L (for tuning)."""
    problem = _problem_of(q, k, is_causal, FlashConfig(tiles, tiles, tiles))
    head_dim = problem.head_dim
    q, k, v, o, do = (_for_kernels(t, head_dim) for t in (q, k, v, o, do))
    dq, delta = _backward_dq(problem, q, k, v, o, lse, do)
    return _cut_to(dq, problem.d), delta


def backward_dkdv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, is_causal: bool, tiles: TileConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dk, dv) with `tiles` (for tuning)."""
    problem = _problem_of(q, k, is_causal, FlashConfig(tiles, tiles, tiles))
    head_dim = problem.head_dim
    q, k, v, do = (_for_kernels(t, head_dim) for t in (q, k, v, do))
    dk, dv = _backward_dkdv(problem, q, k, v, do, lse, delta)
    return _cut_to(dk, problem.d), _cut_to(dv, problem.d)
