"""Tile configs of the FlashAttention-2 kernels, chosen from the GPU's properties.

On sm_90 with a full 227 KiB per block (H100, H200, H800) the tables measured there. Elsewhere
a rule that only takes tiles every target of its class has room for (`systems check-builds`
builds each pick for each target and holds it against that target's shared memory and
registers):
- below sm_90 Triton lowers the tensor descriptors to pointer loads, whose half-precision
  buffers stay small: the measured half-precision tiles fit an A100's 163 KiB and the 99 KiB
  of an RTX 3090/4090; fp32's three-TF32 operand splits do not, and take small tiles.
- sm_90 and later with less shared memory (an RTX 5090: 99 KiB) stage K and V through TMA
  buffers several times those of the pointer lowering: every dtype takes small tiles.
`SYSTEMS_GPU_LIMITS` (`systems.common.hardware`) makes a big GPU choose as a small one would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from systems.common.hardware import MEASURED_TARGET, TARGETS, GpuTarget, device_target


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


def _next_power_of_2(n: int) -> int:
    # not triton.next_power_of_2: a constexpr function, microseconds per host-side call
    return 1 << (n - 1).bit_length()


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
# Head dims between the powers of two take their padded dim's tiles (`head_dim_tiles`
# splits or pads them), and for the one such dim measured, the 2.7b model's 80, narrower
# key tiles won at its in-model sizes (bf16, causal, 128 matrices x 512 and x 2048 rows,
# the tune module on an H100 when 80 was padded to 128; runs in
# studies/attention_tune/runs/2026-11-23/). They stayed best or close to it for the split
# kernels on an H200 (studies/attention_tune/runs/2026-11-23-split/). Keyed by the head
# dim itself.
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

# The rule's small tiles, by padded head dim: 64-row query tiles (16 for fp32 at d = 128),
# two stages for half precision, one for fp32 (fp32's dQ at d = 128 needed 120 KiB on sm_120
# and 136 KiB on sm_89 with two stages of 32-row tiles). Unmeasured: chosen to fit, not for
# speed.
_SMALL_HALF_CONFIGS: dict[int, FlashConfig] = {
    **dict.fromkeys((16, 32, 64), _tiles((64, 64, 4, 2), (64, 64, 4, 2), (32, 64, 4, 2))),
    128: _tiles((64, 64, 4, 2), (64, 32, 4, 2), (32, 64, 4, 2)),
}
_SMALL_FP32_CONFIGS: dict[int, FlashConfig] = {
    **dict.fromkeys((16, 32, 64), _tiles((64, 32, 4, 1), (64, 32, 4, 1), (32, 32, 4, 1))),
    128: _tiles((16, 32, 4, 1), (16, 32, 4, 1), (16, 32, 4, 1)),
}


def is_measured(target: GpuTarget) -> bool:
    """Whether the measured tables are the target's: sm_90 with sm_90's shared memory."""
    return (target.capability == MEASURED_TARGET.capability
            and target.shared_bytes >= MEASURED_TARGET.shared_bytes)


def _pointer_lowered(target: GpuTarget) -> bool:
    """Below sm_90 Triton lowers tensor descriptors to pointer loads, and then the measured
    half-precision tiles fit the least shared memory of that class (sm_86's)."""
    return (target.capability < MEASURED_TARGET.capability
            and target.shared_bytes >= TARGETS["sm_86"].shared_bytes)


def config_for(head_dim: int, dtype: torch.dtype, target: GpuTarget,
               programs: int | None = None) -> FlashConfig:
    """The tiles for this head dim and dtype on `target`. `programs`, the number of (matrix
    x 128-row query tile) pairs, picks smaller half-precision tiles where it would leave
    SMs idle (on the measured GPUs, whose SM count the target then carries)."""
    padded = _next_power_of_2(head_dim)
    half = dtype != torch.float32
    if not (is_measured(target) or half and _pointer_lowered(target)):
        return (_SMALL_HALF_CONFIGS if half else _SMALL_FP32_CONFIGS)[padded]
    if not half:
        return _FP32_CONFIGS[padded]
    if (is_measured(target) and programs is not None and target.sm_count is not None
            and programs < _FEW_PROGRAMS_PER_SM[padded] * target.sm_count):
        return _HALF_FEW_PROGRAM_CONFIG
    return _HALF_HEAD_DIM_CONFIGS.get(head_dim) or _HALF_CONFIGS[padded]


def default_config(head_dim: int, dtype: torch.dtype, programs: int | None = None,
                   device: torch.device | None = None) -> FlashConfig:
    """`config_for` the device's target (`systems.common.hardware.device_target`: the GPU's,
    or the small-GPU switch's); without a device, the switch's or the measured target
    without an SM count."""
    return config_for(head_dim, dtype, device_target(device or torch.device("cpu")), programs)


def configs_for(target: GpuTarget, head_dims: tuple[int, ...], dtypes: tuple[torch.dtype, ...]
                ) -> dict[tuple[int, torch.dtype], list[FlashConfig]]:
    """Every config `config_for` can pick on `target` per (head dim, dtype): the few-program
    tiles too where the target could take them (a GPU of any SM count)."""
    with_sms = GpuTarget(target.capability, target.shared_bytes, target.registers, 1)
    return {(d, dtype): list(dict.fromkeys([config_for(d, dtype, target),
                                            config_for(d, dtype, with_sms, programs=0)]))
            for d in head_dims for dtype in dtypes}
