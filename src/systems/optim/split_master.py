"""An fp32 master weight held as its bf16 rounding plus the 16 bits the rounding dropped.

A bf16 number is the top half of an fp32 bit pattern. Round an fp32 pattern to its top
16 bits, ties away from zero, and what is left over is a signed 16-bit integer:

    pattern = (bf16 pattern << 16) + low,    low in [-2**15, 2**15)

So a bf16 parameter and an int16 tensor of `low` bits hold the fp32 master exactly. For
bf16 parameters over fp32 masters this stores 4 bytes per weight instead of 6 (the bf16
copy beside an fp32 master), and an AdamW step moves 26 bytes per weight instead of 28:
it reads and writes the two halves (8 bytes) where it read and wrote the master and wrote
the copy (10 bytes).

The rounding is round-to-nearest-even except at exact ties (`low` would be +2**15, which
16 signed bits cannot hold), which round away from zero. NaN is kept as bf16's NaN with
`low` 0, so a NaN master never shows up as a number in the parameter.

These are the PyTorch versions; `adamw_kernel` computes the same bits in Triton.
"""

from __future__ import annotations

import torch

_BF16_NAN_BITS = 0x7FC0


def split_master(master: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bf16 parameter, int16 low bits) of an fp32 `master`, which `join_master` restores
    bit for bit."""
    if master.dtype != torch.float32:
        raise ValueError(f"a master must be float32, got {master.dtype}")
    bits = master.view(torch.int32).to(torch.int64)
    high = (bits + 0x8000) >> 16  # floor division: nearest, ties away from zero in magnitude
    low = bits - (high << 16)
    nan = torch.isnan(master)
    high = torch.where(nan, _BF16_NAN_BITS, high)
    low = torch.where(nan, 0, low)
    return high.to(torch.int16).view(torch.bfloat16), low.to(torch.int16)


def join_master(param: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The fp32 master whose halves are the bf16 `param` and the int16 `low` bits."""
    if param.dtype != torch.bfloat16 or low.dtype != torch.int16:
        raise ValueError(f"needs a bfloat16 parameter and int16 low bits, got {param.dtype} "
                         f"and {low.dtype}")
    high = param.view(torch.int16).to(torch.int64) << 16
    bits = (high + low.to(torch.int64)).to(torch.int32)  # wraps like the 32-bit pattern
    return bits.view(torch.float32)
