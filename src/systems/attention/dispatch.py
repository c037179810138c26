"""Which of our kernels `FlashAttentionTriton` runs for a problem: the dispatch table.

A forward (the Triton kernel, or the persistent Gluon forward for Hopper where
`gluon.forward.CONFIGS` holds a config for the head dim) and a backward (the two Triton
passes, or the fused Gluon backward with dQ added in a fixed order) per GPU capability,
dtype, head dim, sequence length, number of tokens (batch x heads x seq) and mask. Every
backward the table may name is deterministic; the Gluon backward that adds dQ in arrival
order is only reached by asking for it (`FlashAttentionTritonUnordered`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from systems.attention.flash_triton.launch import head_dim_tiles
from systems.attention.gluon.backward import BLOCK_N as GLUON_BLOCK_N
from systems.attention.gluon.backward import gluon_head_dim
from systems.attention.gluon.forward import CONFIGS as GLUON_FORWARD_CONFIGS
from systems.attention.gluon.forward import forward_head_dim
from systems.common import hardware

TRITON, GLUON = "triton", "gluon"  # forwards
TWO_PASS, GLUON_ORDERED, GLUON_UNORDERED = "two_pass", "gluon_ordered", "gluon_unordered"
FORWARDS = (TRITON, GLUON)
BACKWARDS = (TWO_PASS, GLUON_ORDERED, GLUON_UNORDERED)
DETERMINISTIC_BACKWARDS = (TWO_PASS, GLUON_ORDERED)
HOPPER = (9, 0)


@dataclass(frozen=True)
class Kernels:
    """One forward and one backward."""

    forward: str
    backward: str

    @property
    def name(self) -> str:
        return f"{self.forward}+{self.backward}"


DEFAULT = Kernels(TRITON, TWO_PASS)
# A rule's pair beats the default by 2% at every shape of its region: a tie keeps the
# default's lean launches.
WIN = 0.98


@dataclass(frozen=True, eq=False)  # hashed by identity: a table is hashed on every call
class Rule:
    """Causal self-attention (q, k, v of one shape) of this capability, dtype and head dim,
    at least `min_seq` long and `min_tokens` tokens (batch x heads x seq), runs `kernels`."""

    capability: tuple[int, int]
    dtype: torch.dtype
    head_dim: int
    min_seq: int
    min_tokens: int
    kernels: Kernels

    def matches(self, capability: tuple[int, int], dtype: torch.dtype, head_dim: int,
                seq: int, tokens: int) -> bool:
        return (capability == self.capability and dtype == self.dtype
                and head_dim == self.head_dim and seq >= self.min_seq
                and tokens >= self.min_tokens)


# Measured on one H100 (sm_90, as the H200; torch 2.11, Triton 3.6), bf16, causal,
# forward+backward, three do_bench rounds taken in turn per shape, by
# `PYTHONPATH=src python -m studies.attention_dispatch.study --head-dim D ...` (its runs are
# saved as studies/attention_dispatch/runs/2026-11-28_h100_one_matrix_d64_d128.json and
# _d80_d96.json, commits 479ccba and 9ed4c42; `--rows A --rows B` forms the table again from
# them). A pair beats the default at a shape where its median per-round ratio to the default
# is below WIN; each rule names a pair that beats it at every measured shape of its region.
# The ordered Gluon backward wins once the GPU is filled (262144 tokens) from 2048 tokens
# per sequence at d = 64 and 80 and from 512 at d = 96 and 128 (there behind the Gluon
# forward), and with fewer tokens, one matrix included, from 8192 (d = 64), 4096 (d = 80)
# and 16384 (d = 96, 128). One matrix of more key blocks than SMs runs descending on chains
# of dQ accumulators (`gluon.backward.library_config`), which brought the regions down to a
# single matrix. Every other shape runs DEFAULT.
TABLE: tuple[Rule, ...] = (
    Rule(HOPPER, torch.bfloat16, 64, min_seq=8192, min_tokens=16384,
         kernels=Kernels(TRITON, GLUON_ORDERED)),
    Rule(HOPPER, torch.bfloat16, 64, min_seq=2048, min_tokens=262144,
         kernels=Kernels(TRITON, GLUON_ORDERED)),
    Rule(HOPPER, torch.bfloat16, 80, min_seq=4096, min_tokens=8192,
         kernels=Kernels(TRITON, GLUON_ORDERED)),
    Rule(HOPPER, torch.bfloat16, 80, min_seq=2048, min_tokens=262144,
         kernels=Kernels(TRITON, GLUON_ORDERED)),
    Rule(HOPPER, torch.bfloat16, 96, min_seq=512, min_tokens=262144,
         kernels=Kernels(TRITON, GLUON_ORDERED)),
    Rule(HOPPER, torch.bfloat16, 96, min_seq=16384, min_tokens=8192,
         kernels=Kernels(TRITON, GLUON_ORDERED)),
    Rule(HOPPER, torch.bfloat16, 128, min_seq=512, min_tokens=262144,
         kernels=Kernels(GLUON, GLUON_ORDERED)),
    Rule(HOPPER, torch.bfloat16, 128, min_seq=16384, min_tokens=8192,
         kernels=Kernels(GLUON, GLUON_ORDERED)),
)


def runnable(kernels: Kernels, capability: tuple[int, int], dtype: torch.dtype,
             head_dim: int, seq: int, is_causal: bool) -> bool:
    """Whether these kernels take causal self-attention of this kind (the Triton ones take
    everything the input checks pass)."""
    gluon_forward = kernels.forward == GLUON
    gluon_backward = kernels.backward != TWO_PASS
    if not (gluon_forward or gluon_backward):
        return True
    return (is_causal and capability == HOPPER and dtype == torch.bfloat16
            and gluon_head_dim(head_dim) is not None and seq % GLUON_BLOCK_N == 0
            and (not gluon_forward or forward_head_dim(head_dim) in GLUON_FORWARD_CONFIGS))


def with_gluon_backward(q: torch.Tensor, backward: str) -> Kernels:
    """`backward` (a Gluon one) after the Gluon forward where it has a config for q's head
    dim and pads it no wider than the Triton forward does, else after the Triton forward:
    the named variants' kernels. (At d = 80 and 96 the Triton forward splits the head dim
    where the Gluon one pads it to 128, and was the faster in every dispatch study run.)"""
    if not q.dim():
        return Kernels(TRITON, backward)
    d = q.shape[-1]
    padded = forward_head_dim(d)
    gluon = padded in GLUON_FORWARD_CONFIGS and padded == sum(head_dim_tiles(d))
    return Kernels(GLUON if gluon else TRITON, backward)


@functools.lru_cache(maxsize=4096)
def _choose(capability: tuple[int, int], dtype: torch.dtype, shape: tuple[int, ...],
            table: tuple[Rule, ...]) -> Kernels:
    head_dim, seq, tokens = shape[-1], shape[-2], math.prod(shape[:-1])
    for rule in table:
        if (rule.matches(capability, dtype, head_dim, seq, tokens)
                and runnable(rule.kernels, capability, dtype, head_dim, seq, True)):
            return rule.kernels
    return DEFAULT


@torch.compiler.assume_constant_result  # Dynamo reads the GPU's capability once, as a constant
def _capability(index: int) -> tuple[int, int]:
    return _device_capability(index)


@functools.cache
def _device_capability(index: int) -> tuple[int, int]:
    # Under the small-GPU switch (SYSTEMS_GPU_LIMITS) the emulated target's capability, so
    # that an H100 standing in for a smaller GPU runs what that GPU would.
    return hardware.capability(torch.device("cuda", index))


def _choice(index: int, dtype: torch.dtype, shape: tuple[int, ...]) -> Kernels:
    """The table's kernels for a causal self-attention problem on CUDA device `index`.
    Dynamo traces the rules themselves (shapes are what it guards on), not their cache."""
    pick = _choose.__wrapped__ if torch.compiler.is_compiling() else _choose
    return pick(_capability(index), dtype, shape, TABLE)


def choose(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> Kernels:
    """The kernels for this call: the first rule of TABLE that matches it, else DEFAULT
    (which also serves everything but causal self-attention on CUDA). Inputs the chosen
    kernels cannot take (dtypes or devices that differ) are refused by their checks. Every
    eager call pays for each attribute read here: the fewest and cheapest are."""
    if not is_causal or not q.is_cuda:
        return DEFAULT
    shape = q.shape
    if k.shape != shape or v.shape != shape or len(shape) < 2:
        return DEFAULT
    return _choice(q.get_device(), q.dtype, shape)


def kernels_for(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                is_causal: bool) -> Kernels:
    """The kernels for self-attention with q, k and v of this shape, dtype and device."""
    if not is_causal or device.type != "cuda" or len(shape) < 2:
        return DEFAULT
    return _choice(torch.cuda.current_device() if device.index is None else device.index,
                   dtype, shape)
