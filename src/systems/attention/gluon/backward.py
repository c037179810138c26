"""Launching the fused Gluon backward (`backward_kernel.py`) on Hopper: configs, the inputs it
takes, descriptors, and the kernels before and after it.

It takes causal self-attention in bf16 on an sm_90 GPU (H100, H200) with a head dim up to
128 (64, 80, 96 and 128 natively, others zero-padded to the next of those: `gluon_head_dim`;
80 and 96 run as 64 columns and a tail, `head_dim_tiles`) and
a sequence length that is a multiple of 128; `unsupported_reason` says why other inputs
are refused. `deterministic=True` adds dQ in a fixed order (bit-identical from run to run),
else in the order the shares arrive, as FA3 does by default.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from systems.attention.flash_triton.launch import head_dim_tiles
from systems.attention.gluon.backward_kernel import (
    BLOCK_N,
    CONSUMER_WARPS,
    finish_kernel,
    gluon_backward_kernel,
    prepare_kernel,
    warpgroup_block,
)
from systems.attention.host_path import replay
from systems.common import hardware
from systems.kernel_runtime.launcher import DescriptorLayout, KernelLauncher, TensorSlot
from systems.kernel_runtime.triton_build import build_for_hopper

SM_REGISTERS = 65536
HEAD_DIMS = (64, 80, 96, 128)  # the kernels' own; others run zero-padded to one of them
PREPARE_ROWS = 64  # rows per program of the kernels before and after the backward


@dataclass(frozen=True)
class GluonConfig:
    # Query rows per tile: 64, or 128 (FA3's at d = 64; at d = 128 the buffers of 128-row
    # tiles outgrow shared memory).
    block_m: int
    num_stages: int  # depth of the Q/dO/LSE/D ring
    producer_warps: int
    worker_regs: int  # registers per thread the producer and dQ writers keep
    async_mma: bool  # overlap softmax and dS^T's store with the tensor cores
    ordered: bool  # dQ added in a fixed order: deterministic
    # The order programs launch and walk their query tiles in (SCHEDULES). A key block
    # sees every query tile at or below its diagonal (causal), so the first key block's
    # program is the longest; unordered, launching it first packs the SMs best.
    schedule: str
    # dQ writer warps: with 2, each owns a slot (every other tile), so that one waits for
    # its reduction to land while the other reduces the next tile.
    writers: int
    # FA3's order of a tile's last matmuls (with async_mma): dV, dQ, dK back to back, dQ
    # handed to the writers while dK runs; else dV, dK, then dQ after a barrier.
    dq_first: bool = False
    # dQ accumulators, key block b adding into b % chains, summed in order at the end:
    # ordered, a tile's shares wait on chains this many times shorter.
    chains: int = 1

    def __post_init__(self) -> None:
        if self.dq_first and not self.async_mma:
            raise ValueError("dq_first issues the matmuls asynchronously: it needs async_mma")
        if self.chains < 1:
            raise ValueError(f"chains must be at least 1, got {self.chains}")

    @property
    def max_regs(self) -> int:
        """The launch's cap: all warps (workers rounded up to warpgroups) times it fill the
        SM's registers; setmaxnreg then moves what the workers give up to the consumers."""
        return register_cap(CONSUMER_WARPS + -(-(self.producer_warps + self.writers) // 4) * 4)


def register_cap(warps: int) -> int:
    """Registers per thread (a multiple of 8) at which `warps` warps fill an SM's registers:
    a warp-specialised launch's maxnreg, from which setmaxnreg moves the workers' spare
    registers to the consumers."""
    return SM_REGISTERS // (32 * warps) // 8 * 8


# backward_kernel.py's docstring says what each does.
SCHEDULES = ("longest_first", "shortest_first", "alternating", "descending")


def _config(block_m: int, async_mma: bool, ordered: bool, schedule: str,
            writers: int, dq_first: bool = False) -> GluonConfig:
    return GluonConfig(block_m=block_m, num_stages=2, producer_warps=1, worker_regs=24,
                       async_mma=async_mma, ordered=ordered, schedule=schedule,
                       writers=writers, dq_first=dq_first)


# The fastest config per (head dim, deterministic) in H100 runs of the study at 16 x 16384
# (studies/attention_gluon_backward/, its README: "The backward in Gluon", "Query tiles of
# 128 rows" and "A schedule per length"). At d = 64 FA3's tiles of 128 query rows halve the
# tiles per key block; at d = 128 their buffers outgrow shared memory. Ordered configs
# alternate, which no length can deadlock (`_check_launch_order`). A tile's last matmuls
# run in FA3's order (`dq_first`), so that the dQ hand-off (where an ordered writer's waits
# reach the consumers) runs under dK: ordered at d = 128, and unordered at both head dims
# (faster at 16 x 16384 and 64 x 4096 on an H200: the study's "The unordered backward in
# FA3's order" and "FA3's order at d = 64"). Ordered at d = 64 the synchronous order stays:
# alternating over many matrices, FA3's order was the slower there. d = 80 and 96 (64
# columns and a tail) take d = 128's: 128-row tiles outgrow shared memory there too.
CONFIGS: dict[tuple[int, bool], GluonConfig] = {
    (64, False): _config(128, async_mma=True, ordered=False, schedule="longest_first",
                         writers=2, dq_first=True),
    (64, True): _config(128, async_mma=False, ordered=True, schedule="alternating", writers=2),
    (128, False): _config(64, async_mma=True, ordered=False, schedule="longest_first",
                          writers=1, dq_first=True),
    (128, True): _config(64, async_mma=True, ordered=True, schedule="alternating", writers=2,
                         dq_first=True),
}
CONFIGS |= {(split, ordered): CONFIGS[128, ordered] for split in (80, 96)
            for ordered in (False, True)}
# Ordered, where a matrix's key blocks fit in half the SMs (up to 8192 tokens per sequence
# on 132 SMs): the longest programs first, one writer, in FA3's order (at d = 64 too: there
# it took 0.93 of the synchronous order's time at 64 x 4096 on an H200, "FA3's order at
# d = 64"). Alternating, the odd matrices' programs start together there and each waits on
# the one before it on every tile; longest first, all of a matrix's key blocks are resident
# at once (so every wait ends), reach each tile a step apart, and pack the SMs best (same
# study, "A schedule per length").
SHORT_ORDERED_CONFIGS: dict[int, GluonConfig] = {
    d: replace(CONFIGS[d, True], schedule="longest_first", writers=1, async_mma=True,
               dq_first=True) for d in HEAD_DIMS}
# Ordered at d = 64, 16 or more matrices whose key blocks fill more than half the SMs but
# not all (8448 to 16896 tokens per sequence on 132 SMs): longest first still, on 2 chains
# of dQ accumulators. A matrix's programs then start as earlier ones' programs end, about
# one per tile's time on average but unevenly; a key block waits on the next one of its
# chain, and 2 chains let a late start be made up over 2 gaps. On an H200 it took 0.95 of
# alternating's time at 16 x 16384 x 64, but 1.18 at 2 x 16384 x 64 (counts between were
# not timed: they alternate); at d = 128 it was level with alternating, which d = 128 (and
# 80 and 96, which take its config) keeps (studies/attention_gluon_backward/, "Longest
# first on chains").
FULL_ORDERED_MIN_MATRICES = 16
FULL_ORDERED_CONFIGS: dict[int, GluonConfig] = {64: replace(SHORT_ORDERED_CONFIGS[64], chains=2)}
# Ordered, one matrix of more key blocks than SMs: alternating, it would launch the
# shortest programs first and leave the longest to the last wave. Descending launches the
# longest first, but its resident key blocks reach each tile together and queue on it;
# chains of accumulators shorten the queues. 4 chains at d = 64; 2 at d = 128, whose
# accumulators (twice as wide) outgrow the L2 sooner, and at 80 and 96, which take d = 128's
# config (studies/attention_one_matrix/).
ONE_MATRIX_ORDERED_CONFIGS: dict[int, GluonConfig] = {
    d: replace(CONFIGS[d, True], schedule="descending", chains=4 if d == 64 else 2)
    for d in HEAD_DIMS}


def library_config(head_dim: int, deterministic: bool, key_blocks: int, matrices: int,
                   sms: int) -> GluonConfig:
    """The backward's config for the kernels' head dim `head_dim` and `matrices` matrices
    of `key_blocks` key blocks, where `sms` SMs can hold its programs at once
    (`resident_sms`)."""
    if deterministic and (2 * key_blocks <= sms or matrices * key_blocks <= sms):
        return SHORT_ORDERED_CONFIGS[head_dim]
    if (deterministic and key_blocks <= sms and matrices >= FULL_ORDERED_MIN_MATRICES
            and head_dim in FULL_ORDERED_CONFIGS):
        return FULL_ORDERED_CONFIGS[head_dim]
    if deterministic and matrices == 1:
        return ONE_MATRIX_ORDERED_CONFIGS[head_dim]
    return CONFIGS[head_dim, deterministic]


def gluon_head_dim(head_dim: int, dims: tuple[int, ...] = HEAD_DIMS) -> int | None:
    """The head dim a Gluon kernel of its own head dims `dims` (the backward's by default)
    runs `head_dim` at: the least of them that holds it (zero columns add nothing to a
    score, and their outputs are cut off), or None."""
    for dim in dims:  # a plain loop: Dynamo traces it (the dispatch asks under compile)
        if 1 <= head_dim <= dim:
            return dim
    return None


def padded_to(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """t with zero columns up to head_dim (t itself where it has as many)."""
    return t if t.shape[-1] == head_dim else F.pad(t, (0, head_dim - t.shape[-1]))


def cut_to(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """t's first head_dim columns, contiguous (t itself where it has as many)."""
    return t if t.shape[-1] == head_dim else t[..., :head_dim].contiguous()


@torch.compiler.assume_constant_result  # compiled code reads it as a constant, untraced
def _on_hopper(index: int) -> bool:
    # A bool: Dynamo compares a constant tuple with another wrongly (torch 2.11).
    return hardware.capability(torch.device("cuda", index)) == (9, 0)


def unsupported_setting(device: torch.device, dtype: torch.dtype, seq: int) -> str | None:
    """Why the Gluon backward cannot run on this device, dtype and sequence length; None if
    it can (`unsupported_reason` checks the rest)."""
    if device.type != "cuda":
        return f"needs a CUDA device, got {device}"
    index = torch.cuda.current_device() if device.index is None else device.index
    if not _on_hopper(index):  # the small-GPU switch's target where it is on
        return f"needs an sm_90 GPU (H100, H200), got {torch.cuda.get_device_name(device)}"
    if dtype != torch.bfloat16:
        return f"needs bf16, got {dtype}"
    if seq == 0 or seq % BLOCK_N:
        return f"needs a sequence length that is a positive multiple of {BLOCK_N}, got {seq}"
    return None


def unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       is_causal: bool) -> str | None:
    """Why the Gluon backward cannot take these inputs; None if it can."""
    if not is_causal:
        return "needs is_causal=True"
    if q.dim() < 2 or q.shape != k.shape or q.shape != v.shape:
        return (f"needs q, k and v of one (..., seq, d) shape, got {tuple(q.shape)}, "
                f"{tuple(k.shape)}, {tuple(v.shape)}")
    if {t.dtype for t in (q, k, v)} != {q.dtype} or {t.device for t in (q, k, v)} != {q.device}:
        return (f"needs q, k and v of one dtype on one device, got {q.dtype}, {k.dtype}, "
                f"{v.dtype} on {q.device}, {k.device}, {v.device}")
    if gluon_head_dim(q.shape[-1]) is None:
        return f"needs a head dim of at most {HEAD_DIMS[-1]}, got {q.shape[-1]}"
    return unsupported_setting(q.device, q.dtype, q.shape[-2])


def descriptor_specs(config: GluonConfig, head_dim: int
                     ) -> dict[str, tuple[str, list[int], object]]:
    """(Triton dtype, block shape, shared layout) of each descriptor parameter, in the
    kernel's order: those of the first `head_dim_tiles` columns, then, where the head dim
    has a tail, those of the tail (the others' parameters are None). The launch's
    descriptors and the sm_90 build check's signature both come from here."""
    block_m = config.block_m
    width, tail = head_dim_tiles(head_dim)
    blocks = [(name, dtype, block) for name, dtype, block in (
        ("q_desc", gl.bfloat16, [block_m, width]),
        ("do_desc", gl.bfloat16, [block_m, width]),
        ("k_desc", gl.bfloat16, [BLOCK_N, width]),
        ("v_desc", gl.bfloat16, [BLOCK_N, width]),
        ("lse_desc", gl.float32, [block_m]),
        ("delta_desc", gl.float32, [block_m]),
        ("dq_desc", gl.float32, dq_chunk(block_m, width)))]
    if tail:
        blocks += [(name.replace("_desc", "_tail_desc"), dtype, [block[0], tail])
                   for name, dtype, block in blocks[:4]]
        blocks.append(("dq_tail_desc", gl.float32, dq_chunk(block_m, tail)))
    specs: dict[str, tuple[str, list[int], object]] = {}
    for name, dtype, block in blocks:
        layout = (DQ_CHUNK_LAYOUT if name.startswith("dq_")
                  else gl.NVMMASharedLayout.get_default_for(block, dtype))
        specs[name] = ("bf16" if dtype == gl.bfloat16 else "fp32", block, layout)
    return specs


# The dQ accumulator as the writers reduce into it: rows of 32 floats, unswizzled, each
# query tile's shares in the order the consumers hold them (`fragment_layout`), which
# `finish_kernel` reads back.
DQ_ROW = 32
DQ_CHUNK_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def dq_chunk(block_m: int, cols: int) -> list[int]:
    """The box of one consumer warpgroup's block of a query tile's dQ share of `cols`
    columns (`warpgroup_block`) as a chunk of rows of DQ_ROW floats."""
    rows, block_cols = warpgroup_block(block_m, cols, CONSUMER_WARPS)
    return [rows * block_cols // DQ_ROW, DQ_ROW]


# The kernel's tail descriptor parameters, None where the head dim has no tail.
TAIL_DESCRIPTORS = tuple(name for name in gluon_backward_kernel.arg_names
                         if name.endswith("_tail_desc"))


def constexprs(head_dim: int, config: GluonConfig, sm_scale: float | None = None
               ) -> dict[str, object]:
    """The kernel's compile-time arguments; `sm_scale` is the caller's head dim's (the
    kernels' own by default: it differs where they run a zero-padded one)."""
    return {"SM_SCALE": head_dim ** -0.5 if sm_scale is None else sm_scale,
            "NUM_STAGES": config.num_stages,
            "PRODUCER_WARPS": config.producer_warps, "WORKER_REGS": config.worker_regs,
            "ASYNC_MMA": config.async_mma, "DQ_FIRST": config.dq_first,
            "ORDERED": config.ordered,
            "SCHEDULE": config.schedule, "CHAINS": config.chains, "WRITERS": config.writers,
            "TAIL": head_dim_tiles(head_dim)[1]}


def gluon_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, is_causal: bool,
                   deterministic: bool = True, config: GluonConfig | None = None,
                   poison: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) shaped like q, k, v from flash_forward's o and L (natural log, shape
    (..., seq)); inputs of any strides (copied to contiguous rows where they are not), and
    of head dims the kernels run zero-padded (`gluon_head_dim`). `config` overrides the one
    `library_config` picks; `poison` fills every buffer the kernels write (D, the dQ
    accumulator, dq, dk, dv) with NaN first, so that an element they skip shows. With
    neither, a layout's calls after the first are replayed from C++ (`replay`)."""
    reason = unsupported_reason(q, k, v, is_causal)
    if reason is not None:
        raise ValueError(f"the Gluon backward {reason}")
    if config is not None and (config.writers not in (1, 2) or config.block_m not in (64, 128)
                               or config.schedule not in SCHEDULES):
        raise ValueError(f"{config}: writers must be 1 or 2, block_m 64 or 128, and the "
                         f"schedule one of {SCHEDULES}")

    def plan() -> _BackwardPlan:
        chosen = config or library_config(gluon_head_dim(q.shape[-1]), deterministic,
                                          q.shape[-2] // BLOCK_N, math.prod(q.shape[:-2]),
                                          resident_sms(q.device))
        return _BackwardPlan.of(q, k, v, o, lse, do, chosen, poison)

    kernels = replay.GLUON_ORDERED_BACKWARD if deterministic else replay.GLUON_UNORDERED_BACKWARD
    return replay.replayed_or_run(kernels, is_causal, [q, k, v, o, lse, do], plan,
                                  replayable=config is None and not poison)


@dataclass(frozen=True)
class _BackwardLaunch:
    """One backward problem's kernels, each compiled on its first call and launched directly
    after (`KernelLauncher`): D and the zeroed dQ accumulator, the fused backward, dQ."""

    prepare: KernelLauncher
    backward: KernelLauncher
    finish: KernelLauncher
    semaphores: int  # how many the ordered dQ needs (one per query tile and chain), else 1
    chains: int  # dQ accumulators


@functools.lru_cache(maxsize=256)
def _backward_launch(rows: int, seq: int, head_dim: int, d: int, config: GluonConfig,
                     device_index: int) -> _BackwardLaunch:
    """The launches for `rows` stacked rows of `seq`-long matrices at the padded `head_dim`
    (the problem's own head dim `d` sets the softmax scale)."""
    _check_launch_order(config, seq // BLOCK_N, torch.device("cuda", device_index))
    accumulators = (config.chains * rows * head_dim // DQ_ROW, DQ_ROW)
    special = {"lse_desc": (rows,), "delta_desc": (rows,), "dq_desc": accumulators,
               "dq_tail_desc": accumulators}
    shapes = {name: special.get(name, (rows, head_dim)) for name in
              descriptor_specs(config, head_dim)}
    rows_kernel = {"HEAD_DIM": head_dim, "ROWS": PREPARE_ROWS, "CHAINS": config.chains}

    def row_kernel(kernel: triton.JITFunction, **more: int) -> KernelLauncher:
        return KernelLauncher(kernel, (rows // PREPARE_ROWS,), rows_kernel | more,
                              num_warps=4, num_stages=3, device_index=device_index)

    backward = KernelLauncher(
        gluon_backward_kernel, (seq // BLOCK_N, rows // seq),
        constexprs(head_dim, config, d ** -0.5), num_warps=CONSUMER_WARPS, num_stages=1,
        device_index=device_index, maxnreg=config.max_regs,
        descriptors=descriptor_layouts(descriptor_specs(config, head_dim), shapes),
        descriptor_type=TensorDescriptor)
    semaphores = config.chains * rows // config.block_m if config.ordered else 1
    finish = row_kernel(finish_kernel, BLOCK_M=config.block_m, MAIN=head_dim_tiles(head_dim)[0])
    return _BackwardLaunch(row_kernel(prepare_kernel), backward, finish,
                           semaphores, config.chains)


@dataclass(frozen=True)
class _BackwardPlan:
    """The backward for tensors of one problem and layout: its launches, and whether it
    reads q, k, v, o, L and do in place (`read_in_place`), where replay can run it."""

    launch: _BackwardLaunch
    seq: int
    d: int
    head_dim: int
    in_place: bool
    poison: bool

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
           lse: torch.Tensor, do: torch.Tensor, config: GluonConfig, poison: bool
           ) -> _BackwardPlan:
        seq, d = q.shape[-2:]
        head_dim = gluon_head_dim(d)
        launch = _backward_launch(math.prod(q.shape[:-1]), seq, head_dim, d, config,
                                  q.get_device())
        in_place = read_in_place((q, k, v, o, do), head_dim) and packed_and_aligned(lse)
        return cls(launch, seq, d, head_dim, in_place, poison)

    def _launches(self, q: object, k: object, v: object, o: object, lse: object, do: object,
                  delta: object, acc: object, dq: object, dk: object, dv: object,
                  semaphores: object) -> list[tuple[KernelLauncher, tuple[object, ...]]]:
        """Each kernel's launcher and arguments in order, given the tensors (or the
        TensorSlots that stand for them): D and the zeroed dQ accumulator, the fused
        backward, dQ."""
        launch = self.launch
        # The tail descriptors read the same tensors from their tail columns.
        tails = ((q, do, k, v, acc) if head_dim_tiles(self.head_dim)[1]
                 else (None,) * len(TAIL_DESCRIPTORS))
        return [(launch.prepare, (o, do, delta, acc)),
                (launch.backward, (q, do, k, v, lse, delta, acc, *tails, dk, dv, semaphores,
                                   self.seq)),
                (launch.finish, (acc, dq, self.d ** -0.5))]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 lse: torch.Tensor, do: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q2, k2, v2, o2, do2 = (aligned_rows(padded_to(t, self.head_dim))
                               for t in (q, k, v, o, do))

        def new(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            return output_buffer(like.shape, dtype, like.device, self.poison)

        delta = new(lse, torch.float32).view(-1)
        acc = output_buffer((self.launch.chains, *q2.shape), torch.float32, q2.device,
                            self.poison)
        dq, dk, dv = new(q2, q.dtype), new(k2, k.dtype), new(v2, v.dtype)
        semaphores = torch.zeros(self.launch.semaphores, dtype=torch.int32, device=q.device)
        for launcher, args in self._launches(q2, k2, v2, o2,
                                             aligned_rows(lse[..., None]).view(-1), do2,
                                             delta, acc, dq, dk, dv, semaphores):
            launcher(*args)
        return tuple(cut_to(grad, self.d).view(like.shape)
                     for grad, like in ((dq, q), (dk, k), (dv, v)))

    def replay_program(self) -> replay.Program | None:
        """This plan for replay (`replay.keep`), where it reads in place: table (q, k, v,
        o, L, do, then D, the dQ accumulator, dq, dk, dv, the ordered dQ's semaphores)."""
        if not self.in_place:
            return None
        slots = map(TensorSlot, range(12))
        launches = [launcher.replay_launch(args) for launcher, args in self._launches(*slots)]
        allocation = replay.Allocation
        allocations = [allocation(4, replay.LIKE),  # D like L
                       allocation(0, replay.FLOAT32_LIKE, self.launch.chains),  # dQ's
                       *(allocation(like, replay.LIKE) for like in (0, 1, 2)),  # dq, dk, dv
                       allocation(0, replay.ZEROS, self.launch.semaphores)]
        return replay.program(allocations, launches, [8, 9, 10])


def read_in_place(tensors: Sequence[torch.Tensor], head_dim: int) -> bool:
    """Whether the kernels read each of these (rows of a head dim) where it is rather than
    a padded or packed copy (`padded_to`, `aligned_rows`), and new tensors like them
    (`torch.empty_like`, as replay allocates the outputs) are laid out as the kernels'
    outputs: packed, 16-byte aligned, `head_dim` columns."""
    return all(t.shape[-1] == head_dim and packed_and_aligned(t) for t in tensors)


def packed_and_aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and t.stride() == packed_strides(t.shape)


def packed_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a packed (contiguous) tensor of this shape, in elements."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def output_buffer(shape: torch.Size | tuple[int, ...], dtype: torch.dtype,
                  device: torch.device, poison: bool) -> torch.Tensor:
    """A buffer a kernel writes whole: empty, or, `poison`, NaN (an element it skips shows)."""
    if poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def descriptor_layouts(specs: dict[str, tuple[str, list[int], object]],
                       shapes: dict[str, tuple[int, ...]]) -> dict[int, DescriptorLayout]:
    """Each `descriptor_specs` entry's TMA descriptor layout over a contiguous tensor of
    `shapes[name]`, by its parameter index (the descriptors lead the kernel's parameters)."""
    layouts = {}
    for index, (name, (_, block, layout)) in enumerate(specs.items()):
        shape = list(shapes[name])
        layouts[index] = (shape, list(packed_strides(shape)), block, layout)
    return layouts


def descriptor_signature(specs: dict[str, tuple[str, list[int], object]]) -> dict[str, str]:
    """Triton's type of each descriptor parameter, for a build without a launch."""
    return {name: f"tensordesc<{dtype}{block},{layout!r}>"
            for name, (dtype, block, layout) in specs.items()}


def resident_sms(device: torch.device) -> int:
    """The SMs this process's programs may hold at once: the GPU's, or under an MPS server
    the share CUDA_MPS_ACTIVE_THREAD_PERCENTAGE leaves it (the device reports them all)."""
    sms = hardware.sm_count(device)
    share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    try:
        percent = float(share) if share else 100.0
    except ValueError:
        return sms
    return max(1, min(sms, int(sms * percent / 100)))


def _check_launch_order(config: GluonConfig, key_blocks: int, device: torch.device) -> None:
    """Ordered, a key block waits for the key blocks before it in its query tiles' order.
    Shortest first, alternating or descending, those started before it: it always waits
    on programs that run. Longest first, they start after it, which needs every key block
    of a matrix resident at once (one program per SM: its shared memory is over half an
    SM's), or the waiting programs fill the GPU and the ones they wait for never start."""
    sms = resident_sms(device)
    if config.ordered and config.schedule == "longest_first" and key_blocks > sms:
        raise ValueError(f"ordered with the longest programs first needs at most one key "
                         f"block per SM ({sms}), got {key_blocks}: it would deadlock; "
                         "alternate or launch the shortest first")


def aligned_rows(t: torch.Tensor) -> torch.Tensor:
    """t as contiguous (rows, d), copied where it is not, or where its start is not 16-byte
    aligned (TMA descriptors need both)."""
    rows = t.reshape(-1, t.shape[-1])
    if rows.is_contiguous() and rows.data_ptr() % 16 == 0:
        return rows
    return rows.clone(memory_format=torch.contiguous_format)


def build(head_dim: int, config: GluonConfig) -> dict[str, int | list[int]]:
    """The backward kernel built for sm_90 as a launch specialises it, on any machine
    (TRITON_INTERPRET=0): shared bytes per block, registers and stack bytes per thread,
    and the register counts its partitions set (`systems.kernel_runtime.triton_build`)."""
    values = constexprs(head_dim, config)
    specs = descriptor_specs(config, head_dim)
    values |= {name: None for name in TAIL_DESCRIPTORS if name not in specs}
    signature = {"dK": "*bf16", "dV": "*bf16", "semaphores": "*i32", "n_q": "i32"}
    signature |= {name: "constexpr" for name in values}
    signature |= descriptor_signature(specs)
    return build_for_hopper(gluon_backward_kernel, signature, values,
                            num_warps=CONSUMER_WARPS, num_stages=1, maxnreg=config.max_regs)
