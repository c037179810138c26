"""Whether a FlashAttention backward of 5 tile matmuls, written in Gluon with FA3's Hopper
schedule, beats our two-pass backward and cuDNN's (one CUDA GPU, bf16, causal).

Our backward runs 7 tile matmuls per (query tile, key tile) pair in two passes; the fused
variants of 5 tried in Triton (dQ by per-element atomics, then by TMA bulk reductions)
were slower, holding dK, dV and a dQ product in one program spills registers at d = 128
(docs/attention.md). FA3 keeps them by splitting a program into warpgroups with roles:
a producer warp issues the TMA loads of Q, dO, LSE and delta tiles into a ring of shared
buffers guarded by mbarriers and gives its registers up (setmaxnreg), while two consumer
warpgroups, each owning 64 of the key block's 128 keys, run S^T, dP^T, dV, dK and, after
swapping dS^T through shared memory, the query tile's dQ share, added into an fp32
accumulator. `gluon_backward_kernel` is that schedule in Gluon; its configs add dQ either
by atomics from the consumers or, as FA3 does, through a shared ring that a writer warp
empties with TMA bulk reductions (an op Gluon 3.6's builder has but its `tma` module does
not wrap: `_tma_reduce_add`), with synchronous or overlapped (async) warpgroup MMAs. As
in FA3, each warpgroup may hand its half over on its own named barriers ("tma_wg"), and
the halves may be added in a fixed order through a semaphore per query tile
("tma_ordered": deterministic), by one writer warp or two.

The variant's time counts, as our dQ pass and cuDNN's backward do, D = rowsum(O * dO) and
zeroing the fp32 accumulator (one Triton kernel before it) and dQ = acc * scale cast to
bf16 (one after). Per head dim it reports each backward's max abs errors against an fp32
reference (attention_dq_reduce's), how far two runs of the variant's dQ differ (only
"tma_ordered" adds in a fixed order), and do_bench medians of our forward and
two-pass backward (and of its dQ pass, D included, and its dK/dV pass alone: dq_pass_ms,
dkdv_pass_ms), cuDNN's forward and backward and each variant config. A config that fails
to build or run is recorded as an error row.

Where the variant's time goes: its rows marked "ablation" leave parts of dQ out, with the
same host work, so that differences between rows of one config are kernel time. dq_mode
"discard" swaps dS^T and multiplies dQ, then adds it only if a runtime argument is nonzero
(it is 0: no add, and the compiler cannot drop the product); "skip" computes dK and dV
alone (4 matmuls, no swap: the work of our dK/dV pass); "tma_half" hands every share to
the writer as "tma" does, which reduces only every other one; "tma_early" frees each slot
before reducing it, so the consumers never wait for one. So against the full config,
discard prices the add, skip the dQ matmul with the swap, tma_half whether the add's cost
follows the bytes reduced or the hand-offs, and tma_early what waiting for a slot costs.
Ablation rows check dK and dV only (dq_untouched: nothing was added) and are never the
summary's best config.

Usage: PYTHONPATH=src python scripts/attention_gluon_backward.py --out DIR --commit HASH
       TRITON_INTERPRET=0 PYTHONPATH=src python scripts/attention_gluon_backward.py --build-only
(--build-only builds every config for sm_90 without a GPU and reports its resources.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, astuple, dataclass

import torch
import triton
import triton.language as tl
from attention_dq_reduce import (
    GRADS,
    _bench,
    _errors,
    _first_line,
    _max_abs,
    attempt,
    cudnn_row,
    reference_grads,
    run_study,
)
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from systems.attention.flash_triton import launch, tune
from systems.triton_build import HOPPER_SHARED_BYTES, build_for_hopper

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
BLOCK_N = 128  # keys per program: 64 per consumer warpgroup
CONSUMER_WARPS = 8
SM_REGISTERS = 65536
# How a query tile's dQ share is added into the fp32 accumulator: "atomic", per element
# from the consumers; "tma", by the writer warp's bulk reductions; the ablations: "discard",
# dS^T swapped and dQ multiplied, then added only if a runtime argument (0) says so;
# "skip", dK and dV alone (4 matmuls, no swap); "tma_half", as "tma" with every share
# handed to the writer but only every other one reduced (half the bytes added);
# "tma_early", as "tma" with each slot freed before its reduction (no waiting for slots);
# "tma_wg", as "tma" with each warpgroup handing its half of the share to the writer on its
# own named barriers (FA3's hand-off: no barrier of both warpgroups, no mbarrier);
# "tma_ordered", as "tma_wg" with each query tile's shares added in a fixed order, key
# blocks last to first, through a semaphore per tile (deterministic, as FA3's option);
# "tma_landed", as "tma_ordered" without waiting for its turn (in no fixed order): each
# reduction still lands before the writer goes on, pricing that wait apart from the order.
DQ_MODES = ("atomic", "tma", "discard", "skip", "tma_half", "tma_early", "tma_wg",
            "tma_ordered", "tma_landed")
HALF_MODES = ("tma_wg", "tma_ordered", "tma_landed")  # a warpgroup hands over its half alone
SEMAPHORE_MODES = ("tma_ordered", "tma_landed")  # wait for reductions to land, bump a count
WRITER_MODES = ("tma", "tma_half", "tma_early") + HALF_MODES  # the modes with a dQ writer
# Named barriers of the half hand-off, of 160 threads each (a consumer warpgroup and the
# writer warp; ids 0 and 1 are Triton's): the writer waits on FULL + 2 * slot + warpgroup
# for a half, the warpgroup on EMPTY + 2 * slot + itself for the slot to be free again.
FULL_BARRIER: gl.constexpr = gl.constexpr(8)
EMPTY_BARRIER: gl.constexpr = gl.constexpr(12)
KEY_BLOCK: gl.constexpr = gl.constexpr(BLOCK_N)


@dataclass(frozen=True)
class GluonConfig:
    block_m: int  # query rows per tile
    num_stages: int  # depth of the Q/dO/LSE/delta ring
    producer_warps: int
    worker_regs: int  # registers per thread the producer (and dQ writer) keep
    async_mma: bool  # overlap softmax and dS^T's store with the tensor cores
    dq_mode: str  # one of DQ_MODES
    # Key blocks vary fastest in the grid (the programs running at once share a matrix and
    # its part of the dQ accumulator); else the matrices do.
    keys_fastest: bool = True
    # Key blocks first to last: the first sees every query tile (causal), so the longest
    # programs start first and the short ones fill the last wave; else the reverse.
    longest_first: bool = True
    # dQ writer warps (the half modes may take 2: each then owns a slot, every other tile,
    # so that one waits for its reduction to land while the other reduces the next tile).
    writers: int = 1

    @property
    def ablation(self) -> bool:
        """Whether the config leaves dQ out, all or part: timed, never a candidate."""
        return self.dq_mode in ("discard", "skip", "tma_half", "tma_early")

    @property
    def max_regs(self) -> int:
        """The launch's cap: all warps (workers rounded up to warpgroups) times it fill the
        SM's registers; setmaxnreg then moves what the workers give up to the consumers."""
        workers = self.producer_warps + (self.writers if self.dq_mode in WRITER_MODES else 0)
        warps = CONSUMER_WARPS + -(-workers // 4) * 4
        return SM_REGISTERS // (32 * warps) // 8 * 8


CONFIGS: dict[int, list[GluonConfig]] = {
    head_dim: [GluonConfig(64, 2, 1, 24, use_async, "tma"),
               GluonConfig(64, 2, 1, 24, use_async, "tma_wg"),
               GluonConfig(64, 2, 1, 24, use_async, "tma_ordered"),
               GluonConfig(64, 2, 1, 24, use_async, "tma_ordered", longest_first=False),
               GluonConfig(64, 2, 1, 24, use_async, "tma_ordered", writers=2),
               GluonConfig(64, 2, 1, 24, use_async, "tma_ordered", longest_first=False,
                           writers=2),
               GluonConfig(64, 2, 1, 24, use_async, "tma_wg", writers=2),
               GluonConfig(64, 2, 1, 24, use_async, "tma_landed"),
               GluonConfig(64, 2, 1, 24, use_async, "tma_landed", longest_first=False,
                           writers=2),
               GluonConfig(64, 2, 1, 24, use_async, "discard"),
               GluonConfig(64, 2, 1, 24, False, "skip")]
    for head_dim, use_async in ((64, True), (128, False))
}
"""Per head dim, the fastest MMA mode of earlier H100 runs (16 x 16384; async at d = 64,
synchronous at d = 128) with dQ handed over whole ("tma") and by halves ("tma_wg"), the
deterministic order with the longest programs first and last (a key block then starts
before the ones that add before it, not after), each with one writer warp and two, the
ordered mode without its wait for a turn ("tma_landed"), and the ablations that price
the add. Runs saved beside the script measured what is left out: atomics, the other
grid orders, "tma_half" and "tma_early" (each slower than or level with "tma"); 3 stages,
4 producer warps, 56 worker registers and 128-row query tiles were slower still."""


@builtin
def _tma_reduce_add(desc, coord, src, _semantic=None):
    # cp.reduce.async.bulk.tensor (add) from shared memory: Gluon 3.6's builder has the op,
    # its hopper `tma` module does not wrap it.
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle,
                                              coord, src.handle)


@gluon.constexpr_function
def _has_writer(dq_mode):
    return dq_mode in WRITER_MODES


@gluon.constexpr_function
def _by_halves(dq_mode):
    return dq_mode in HALF_MODES


@gluon.constexpr_function
def _counts_landings(dq_mode):
    return dq_mode in SEMAPHORE_MODES


# Inline PTX for what Gluon 3.6 does not wrap. Each returns a dummy value (inline asm must
# return one); none is pure, so none is dropped or moved across memory operations.
@gluon.jit
def _thread_index():
    return gl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r", [], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _named_sync(barrier):
    """bar.sync on a named barrier of 160 threads: waits for the others."""
    gl.inline_asm_elementwise("bar.sync $1, 160; mov.u32 $0, 0;", "=r,r,~{memory}", [barrier],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _named_arrive(barrier):
    """bar.arrive on a named barrier of 160 threads: signals, never waits."""
    gl.inline_asm_elementwise("bar.arrive $1, 160; mov.u32 $0, 0;", "=r,r,~{memory}",
                              [barrier], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _wait_turn(semaphore, turn):
    """Spins until a query tile's semaphore reaches `turn` (acquire at GPU scope), then
    orders the copy engine's coming reduction after it."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 v; wait_turn: ld.acquire.gpu.global.b32 v, [$1]; "
        "setp.ne.s32 p, v, $2; @p bra wait_turn; fence.proxy.async.global; mov.u32 $0, v; }",
        "=r,l,r,~{memory}", [semaphore, turn], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pass_turn(semaphore):
    """Lane 0, the lane that issued the bulk reductions, waits until they are written to
    global memory (not only read from shared memory), then bumps the tile's semaphore
    with release semantics at GPU scope."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 l; mov.u32 l, %laneid; setp.eq.u32 p, l, 0; "
        "@p cp.async.bulk.wait_group 0; @p fence.proxy.async.global; "
        "@p red.release.gpu.global.add.s32 [$1], 1; mov.u32 $0, 0; }",
        "=r,l,~{memory}", [semaphore], dtype=gl.int32, is_pure=False, pack=1)


@gluon.constexpr_function
def _mma_layout(rows, cols, num_warps):
    # Warpgroups stack along rows while each keeps >= 64 of them (FA3's split of the keys
    # for S^T, dK, dV), then split the columns (dQ of a 64-row tile: half of d each).
    along_rows = min(num_warps, max(4, rows // 16))
    along_cols = num_warps // along_rows
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[along_rows, along_cols],
                                     instr_shape=[16, cols // along_cols, 16])


@gluon.jit
def _load_partition(descs, bufs, bars, bh, n_q, k_start):
    """Producer: K and V once, then each query tile's Q, dO, LSE and delta into the ring."""
    q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc = descs
    q_bufs, do_bufs, lse_bufs, delta_bufs, k_smem, v_smem = bufs
    ready, empty, kv_bar = bars
    NUM_STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1]
    row0 = bh * n_q
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [row0 + k_start, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [row0 + k_start, 0], kv_bar, v_smem)
    tile_bytes: gl.constexpr = 2 * q_desc.block_type.nbytes + 2 * lse_desc.block_type.nbytes
    for i in range((n_q - k_start) // BLOCK_M):
        stage = i % NUM_STAGES
        # Barriers start as if phase 1 completed: the first pass over the ring waits on nothing.
        mbarrier.wait(empty.index(stage), ((i // NUM_STAGES) & 1) ^ 1)
        row = row0 + k_start + i * BLOCK_M
        bar = ready.index(stage)
        mbarrier.expect(bar, tile_bytes)
        tma.async_copy_global_to_shared(q_desc, [row, 0], bar, q_bufs.index(stage))
        tma.async_copy_global_to_shared(do_desc, [row, 0], bar, do_bufs.index(stage))
        tma.async_copy_global_to_shared(lse_desc, [row], bar, lse_bufs.index(stage))
        tma.async_copy_global_to_shared(delta_desc, [row], bar, delta_bufs.index(stage))


@gluon.jit
def _tile(i, dk, dv, bufs, bars, ds_bufs, dq_out, dq_live, keys, k_start, qk_scale,
          HEAD_DIM: gl.constexpr, MASKED: gl.constexpr, ASYNC: gl.constexpr,
          DQ_MODE: gl.constexpr):
    """One query tile: dV += P^T dO, dK += dS^T Q, dQ[tile] += dS K (unscaled; DQ_MODE
    "skip": none). ASYNC overlaps the softmax with dP^T and the dS^T store with dV and dK."""
    q_bufs, do_bufs, lse_bufs, delta_bufs, k_smem, v_smem = bufs
    ready, empty, kv_bar = bars
    NUM_STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[0]
    s_layout: gl.constexpr = _mma_layout(BLOCK_N, BLOCK_M, gl.num_warps())
    kv_layout: gl.constexpr = _mma_layout(BLOCK_N, HEAD_DIM, gl.num_warps())
    dq_layout: gl.constexpr = _mma_layout(BLOCK_M, HEAD_DIM, gl.num_warps())
    # P^T and dS^T feed the dV and dK matmuls from registers, as FA3 does.
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    stage = i % NUM_STAGES
    q_start = k_start + i * BLOCK_M
    mbarrier.wait(ready.index(stage), (i // NUM_STAGES) & 1)
    q_s = q_bufs.index(stage)
    do_s = do_bufs.index(stage)
    lse2 = gl.expand_dims(lse_bufs.index(stage).load(row_layout) * LOG2E, 0)
    delta = gl.expand_dims(delta_bufs.index(stage).load(row_layout), 0)

    zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    s_t = warpgroup_mma(k_smem, q_s.permute((1, 0)), zero_s, use_acc=False, is_async=ASYNC)
    dp_t = warpgroup_mma(v_smem, do_s.permute((1, 0)), zero_s, use_acc=False,
                         is_async=ASYNC)
    if ASYNC:  # the softmax runs while dP^T is in flight
        s_t = warpgroup_mma_wait(1, deps=(s_t,))
    p_t = gl.exp2(s_t * qk_scale - lse2)
    if MASKED:  # the key block's diagonal tiles
        rows = q_start + gl.arange(0, BLOCK_M, row_layout)
        p_t = gl.where(gl.expand_dims(rows, 0) >= gl.expand_dims(keys, 1), p_t, 0.0)
    p_op = gl.convert_layout(p_t.to(gl.bfloat16), a_layout)
    if ASYNC:
        dp_t = warpgroup_mma_wait(0, deps=(dp_t,))
    dv = warpgroup_mma(p_op, do_s, dv, is_async=ASYNC)
    ds_t = (p_t * (dp_t - delta)).to(gl.bfloat16)
    ds_op = gl.convert_layout(ds_t, a_layout)
    dk = warpgroup_mma(ds_op, q_s, dk, is_async=ASYNC)

    # dQ needs all 128 keys' dS: both warpgroups put theirs in shared memory. Two buffers,
    # so one warpgroup's next store cannot overwrite what the other still multiplies.
    if DQ_MODE != "skip":
        ds_s = ds_bufs.index(i % 2)
        ds_s.store(ds_t)
        fence_async_shared()  # dS^T (and the LSE/delta reads) ordered before async-proxy use
    if ASYNC:  # register operands stay live until their matmuls are done
        dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
    if DQ_MODE == "skip":  # after the wait: with async MMAs, a fence between dK's
        fence_async_shared()  # wgmma and its wait crashes ptxas 12.8 (error code -11)
    gl.thread_barrier()  # both halves stored; both warpgroups are past Q and dO
    mbarrier.arrive(empty.index(stage), count=1)  # dQ's matmul reads only dS^T and K
    if DQ_MODE != "skip":
        zero_q = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
        dq = warpgroup_mma(ds_s.permute((1, 0)), k_smem, zero_q, use_acc=False)
        _add_dq(i, dq, dq_out, dq_live, q_start, DQ_MODE)
    return dk, dv


@gluon.jit
def _add_dq(i, dq, dq_out, dq_live, q_start, DQ_MODE: gl.constexpr):
    """Adds a query tile's dQ share: each warpgroup's half into the writers' two-slot ring
    on named barriers (the half modes: dq_out is (buffers,)), the whole share into it on
    mbarriers (the other writer modes: (buffers, ready, empty)), else by atomics (dq_out:
    the matrix's fp32 accumulator),
    "discard" only where dq_live is nonzero (the host passes 0: dQ is computed, never
    added, and the compiler cannot drop it)."""
    BLOCK_M: gl.constexpr = dq.type.shape[0]
    HEAD_DIM: gl.constexpr = dq.type.shape[1]
    if _by_halves(DQ_MODE):  # warpgroup w holds columns [w * d/2, (w + 1) * d/2) of dq
        dq_bufs = dq_out[0]
        own = (i % 2) * 2 + _thread_index() // 128
        if i >= 2:  # the slot's share of two tiles ago is reduced
            _named_sync(EMPTY_BARRIER + own)
        dq_bufs.index(i % 2).store(dq)
        fence_async_shared()
        _named_arrive(FULL_BARRIER + own)
    elif _has_writer(DQ_MODE):
        dq_bufs, dq_ready, dq_empty = dq_out
        mbarrier.wait(dq_empty.index(i % 2), ((i // 2) & 1) ^ 1)
        dq_bufs.index(i % 2).store(dq)
        fence_async_shared()
        gl.thread_barrier()  # the whole tile stored before the writer is told
        mbarrier.arrive(dq_ready.index(i % 2), count=1)
    elif DQ_MODE == "atomic" or dq_live != 0:  # a constexpr `or` short-circuits: static
        rows = q_start + gl.arange(0, BLOCK_M, gl.SliceLayout(1, dq.type.layout))
        cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, dq.type.layout))
        offsets = gl.expand_dims(rows, 1) * HEAD_DIM + gl.expand_dims(cols, 0)
        gl.atomic_add(dq_out + offsets, dq, sem="relaxed")


@gluon.jit
def _dq_partition(dq_desc, dq_ring, semaphores, bh, n_q, k_start, DQ_MODE: gl.constexpr,
                  WRITER: gl.constexpr = 0, WRITERS: gl.constexpr = 1):
    """dQ writer: each tile's share added into the accumulator by the copy engine. The
    ablations: "tma_half" reduces every other share (half the bytes, every hand-off);
    "tma_early" frees the slot before reducing it (the consumers never wait for a slot;
    a share may be overwritten before it is read)."""
    BLOCK_M: gl.constexpr = dq_ring[0].type.shape[1]
    row0 = bh * n_q + k_start
    if _by_halves(DQ_MODE):
        _dq_halves(dq_desc, dq_ring[0], semaphores + bh * (n_q // BLOCK_M), row0,
                   (n_q - k_start) // BLOCK_M, k_start, DQ_MODE, WRITER, WRITERS)
    else:
        _dq_shares(dq_desc, dq_ring, row0, (n_q - k_start) // BLOCK_M, DQ_MODE)


@gluon.jit
def _dq_halves(dq_desc, dq_bufs, semaphores, row0, n_tiles, k_start, DQ_MODE: gl.constexpr,
               WRITER: gl.constexpr, WRITERS: gl.constexpr):
    """Each tile's two halves reduced as their warpgroups hand them over (writer WRITER of
    WRITERS: tiles WRITER, WRITER + WRITERS, ...); "tma_ordered" first waits for the key
    blocks after this one to have added theirs (`semaphores`: the matrix's, one per query
    tile, counting the key blocks done)."""
    BLOCK_M: gl.constexpr = dq_bufs.type.shape[1]
    HALF: gl.constexpr = dq_desc.block_type.shape[1]
    for i in range(WRITER, n_tiles, WRITERS):
        q_start = k_start + i * BLOCK_M
        if DQ_MODE == "tma_ordered":  # key blocks add last to first: the diagonal's first
            last_key_block = (q_start + BLOCK_M - 1) // KEY_BLOCK
            _wait_turn(semaphores + q_start // BLOCK_M, last_key_block - k_start // KEY_BLOCK)
        for half in gl.static_range(2):
            _named_sync(FULL_BARRIER + (i % 2) * 2 + half)
            _tma_reduce_add(dq_desc, [row0 + i * BLOCK_M, half * HALF],
                            dq_bufs.index(i % 2).slice(half * HALF, HALF, dim=1))
        tma.store_wait(0)  # both halves read: the slot may be refilled
        if i < n_tiles - 2:  # the consumers wait on a slot from their third tile on
            for half in gl.static_range(2):
                _named_arrive(EMPTY_BARRIER + (i % 2) * 2 + half)
        if _counts_landings(DQ_MODE):  # "tma_landed" bumps a semaphore nobody waits on
            _pass_turn(semaphores + q_start // BLOCK_M)


@gluon.jit
def _dq_shares(dq_desc, dq_ring, row0, n_tiles, DQ_MODE: gl.constexpr):
    """Each tile's whole share, handed over through the ring's mbarriers."""
    dq_bufs, dq_ready, dq_empty = dq_ring
    BLOCK_M: gl.constexpr = dq_bufs.type.shape[1]
    for i in range(n_tiles):
        mbarrier.wait(dq_ready.index(i % 2), (i // 2) & 1)
        if DQ_MODE == "tma_early":
            mbarrier.arrive(dq_empty.index(i % 2), count=1)
        if DQ_MODE != "tma_half" or i % 2 == 0:  # a constexpr `or` short-circuits: static
            _tma_reduce_add(dq_desc, [row0 + i * BLOCK_M, 0], dq_bufs.index(i % 2))
            tma.store_wait(0)  # the slot has been read
        if DQ_MODE != "tma_early":
            mbarrier.arrive(dq_empty.index(i % 2), count=1)


@gluon.jit
def _compute_partition(bufs, bars, ds_bufs, dq_out, dq_live, dK, dV, bh, n_q, k_start,
                       SM_SCALE: gl.constexpr, HEAD_DIM: gl.constexpr,
                       ASYNC: gl.constexpr, DQ_MODE: gl.constexpr):
    """Consumers (the default partition, two warpgroups): every query tile from the key
    block's diagonal down, then dK (scaled) and dV stored as bf16."""
    q_bufs, do_bufs, lse_bufs, delta_bufs, k_smem, v_smem = bufs
    ready, empty, kv_bar = bars
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[0]
    s_layout: gl.constexpr = _mma_layout(BLOCK_N, BLOCK_M, gl.num_warps())
    kv_layout: gl.constexpr = _mma_layout(BLOCK_N, HEAD_DIM, gl.num_warps())
    qk_scale = SM_SCALE * LOG2E
    keys = k_start + gl.arange(0, BLOCK_N, gl.SliceLayout(1, s_layout))
    matrix = (bh * n_q).to(gl.int64) * HEAD_DIM
    if not _has_writer(DQ_MODE):
        dq_out = dq_out + matrix

    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    mbarrier.wait(kv_bar, 0)
    n_diagonal: gl.constexpr = BLOCK_N // BLOCK_M
    for i in range(n_diagonal):
        dk, dv = _tile(i, dk, dv, bufs, bars, ds_bufs, dq_out, dq_live, keys, k_start,
                       qk_scale, HEAD_DIM, True, ASYNC, DQ_MODE)
    for i in range(n_diagonal, (n_q - k_start) // BLOCK_M):
        dk, dv = _tile(i, dk, dv, bufs, bars, ds_bufs, dq_out, dq_live, keys, k_start,
                       qk_scale, HEAD_DIM, False, ASYNC, DQ_MODE)

    rows = k_start + gl.arange(0, BLOCK_N, gl.SliceLayout(1, kv_layout))
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, kv_layout))
    offsets = matrix + gl.expand_dims(rows, 1) * HEAD_DIM + gl.expand_dims(cols, 0)
    gl.store(dK + offsets, (dk * SM_SCALE).to(gl.bfloat16))
    gl.store(dV + offsets, dv.to(gl.bfloat16))


@gluon.jit(do_not_specialize=["dq_live"])
def gluon_backward_kernel(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, dq_desc, dQ,
                          dK, dV, semaphores, n_q, dq_live, SM_SCALE: gl.constexpr,
                          NUM_STAGES: gl.constexpr, PRODUCER_WARPS: gl.constexpr,
                          WORKER_REGS: gl.constexpr, ASYNC_MMA: gl.constexpr,
                          DQ_MODE: gl.constexpr, KEYS_FASTEST: gl.constexpr,
                          LONGEST_FIRST: gl.constexpr, WRITERS: gl.constexpr):
    """Grid (key blocks, matrices), or (matrices, key blocks) unless KEYS_FASTEST; causal;
    rows of all matrices stacked ((bh * n_q, d) descriptors, n_q a multiple of BLOCK_N).
    Key blocks run first to last (the longest programs first) if LONGEST_FIRST, else last
    to first. dQ (and dq_desc over it) is an fp32 (bh * n_q, d) accumulator; dK, dV bf16;
    semaphores int32 (bh, n_q / BLOCK_M), zero, used by DQ_MODEs "tma_ordered" and
    "tma_landed" only.
    dq_live matters to DQ_MODE "discard" only (see `_add_dq`); it is never specialised
    on, so that the compiler cannot know it."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK: gl.constexpr = k_desc.block_type.shape[0]
    KEY_AXIS: gl.constexpr = 0 if KEYS_FASTEST else 1
    bh = gl.program_id(1 - KEY_AXIS)
    key_block = gl.program_id(KEY_AXIS)
    if not LONGEST_FIRST:
        key_block = gl.num_programs(KEY_AXIS) - 1 - key_block
    k_start = key_block * BLOCK

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM],
                                       q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM],
                                        do_desc.layout)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_M], lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_M],
                                           delta_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [BLOCK, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [BLOCK, HEAD_DIM], v_desc.layout)
    ds_bufs: gl.constexpr = None  # "skip" swaps no dS^T
    if DQ_MODE != "skip":
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, BLOCK_M],
                                                                       gl.bfloat16)
        ds_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK, BLOCK_M], ds_layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    mbarrier.init(kv_bar, count=1)

    descs = (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc)
    bufs = (q_bufs, do_bufs, lse_bufs, delta_bufs, k_smem, v_smem)
    bars = (ready, empty, kv_bar)
    if _has_writer(DQ_MODE):
        # Two slots of a whole share (for the half modes, dq_desc's box is half of it;
        # fp32 rows of >= 32 columns take the same 128-byte swizzle either way).
        dq_bufs = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM], dq_desc.layout)
        dq_ring = (dq_bufs,)  # the half modes hand over on named barriers
        if not _by_halves(DQ_MODE):
            dq_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            for s in gl.static_range(2):
                mbarrier.init(dq_ready.index(s), count=1)
                mbarrier.init(dq_empty.index(s), count=1)
            dq_ring = (dq_bufs, dq_ready, dq_empty)
        if WRITERS == 1:
            gl.warp_specialize([
                (_compute_partition, (bufs, bars, ds_bufs, dq_ring, dq_live, dK, dV, bh, n_q,
                                      k_start, SM_SCALE, HEAD_DIM, ASYNC_MMA, DQ_MODE)),
                (_load_partition, (descs, bufs, bars, bh, n_q, k_start)),
                (_dq_partition, (dq_desc, dq_ring, semaphores, bh, n_q, k_start, DQ_MODE)),
            ], [PRODUCER_WARPS, 1], [WORKER_REGS, WORKER_REGS])
        else:  # two writers, each on its slot
            gl.warp_specialize([
                (_compute_partition, (bufs, bars, ds_bufs, dq_ring, dq_live, dK, dV, bh, n_q,
                                      k_start, SM_SCALE, HEAD_DIM, ASYNC_MMA, DQ_MODE)),
                (_load_partition, (descs, bufs, bars, bh, n_q, k_start)),
                (_dq_partition, (dq_desc, dq_ring, semaphores, bh, n_q, k_start, DQ_MODE,
                                 0, 2)),
                (_dq_partition, (dq_desc, dq_ring, semaphores, bh, n_q, k_start, DQ_MODE,
                                 1, 2)),
            ], [PRODUCER_WARPS, 1, 1], [WORKER_REGS] * 3)
    else:
        gl.warp_specialize([
            (_compute_partition, (bufs, bars, ds_bufs, dQ, dq_live, dK, dV, bh, n_q, k_start,
                                  SM_SCALE, HEAD_DIM, ASYNC_MMA, DQ_MODE)),
            (_load_partition, (descs, bufs, bars, bh, n_q, k_start)),
        ], [PRODUCER_WARPS], [WORKER_REGS])


def _descriptor_specs(config: GluonConfig, head_dim: int
                      ) -> dict[str, tuple[str, list[int], object]]:
    """(Triton dtype, block shape, shared layout) of each descriptor parameter; the host's
    descriptors and the build-only signature both come from here."""
    block_m = config.block_m
    dq_columns = head_dim // 2 if config.dq_mode in HALF_MODES else head_dim
    specs: dict[str, tuple[str, list[int], object]] = {}
    for name, dtype, block in (("q_desc", gl.bfloat16, [block_m, head_dim]),
                               ("do_desc", gl.bfloat16, [block_m, head_dim]),
                               ("k_desc", gl.bfloat16, [BLOCK_N, head_dim]),
                               ("v_desc", gl.bfloat16, [BLOCK_N, head_dim]),
                               ("lse_desc", gl.float32, [block_m]),
                               ("delta_desc", gl.float32, [block_m]),
                               ("dq_desc", gl.float32, [block_m, dq_columns])):
        layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
        specs[name] = ("bf16" if dtype == gl.bfloat16 else "fp32", block, layout)
    return specs


def _constexprs(head_dim: int, config: GluonConfig) -> dict[str, object]:
    return {"SM_SCALE": head_dim ** -0.5, "NUM_STAGES": config.num_stages,
            "PRODUCER_WARPS": config.producer_warps, "WORKER_REGS": config.worker_regs,
            "ASYNC_MMA": config.async_mma, "DQ_MODE": config.dq_mode,
            "KEYS_FASTEST": config.keys_fastest, "LONGEST_FIRST": config.longest_first,
            "WRITERS": config.writers}


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                  lse: torch.Tensor, do: torch.Tensor, config: GluonConfig) -> None:
    """What the kernel assumes, as errors rather than wrong gradients."""
    if q.dim() != 3:
        raise ValueError(f"q must be (batch, seq, d), got {tuple(q.shape)}")
    batch, seq, head_dim = q.shape
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)):
        if t.shape != q.shape or t.dtype != torch.bfloat16 or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous bf16 {tuple(q.shape)}, got "
                             f"{t.dtype} {tuple(t.shape)} strides {t.stride()}")
    if lse.shape != (batch, seq) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"lse must be contiguous fp32 {(batch, seq)}, got {lse.dtype} "
                         f"{tuple(lse.shape)}")
    if head_dim not in CONFIGS:
        raise ValueError(f"head dim {head_dim} not in {sorted(CONFIGS)}")
    if config.dq_mode not in DQ_MODES:
        raise ValueError(f"dq_mode {config.dq_mode!r} not in {DQ_MODES}")
    if config.writers not in (1, 2) or (config.writers == 2 and config.dq_mode not in HALF_MODES):
        raise ValueError(f"writers {config.writers}: 1, or 2 with dq_mode in {HALF_MODES}")
    if config.dq_mode == "tma_ordered" and not config.keys_fastest:
        # A program waits only for its matrix's later key blocks, which must be resident
        # or done: a matrix's key blocks are launched together (and, unless they are
        # launched last to first, in order).
        raise ValueError("dq_mode 'tma_ordered' needs keys_fastest")
    if seq % BLOCK_N or BLOCK_N % config.block_m:
        raise ValueError(f"seq {seq} must be a multiple of {BLOCK_N}, and {BLOCK_N} of the "
                         f"query tile {config.block_m}")


def gluon_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, config: GluonConfig,
                   poison: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of causal self-attention on contiguous bf16 (batch, seq, d) inputs; lse
    is flash_forward's (natural log); dq is zero for "discard" and "skip" and not the
    gradient for "tma_half" and "tma_early", which do the same host work. `poison` fills
    dK and dV with NaN first, so that a tile the kernel skips shows in the errors."""
    _check_inputs(q, k, v, o, lse, do, config)
    batch, seq, head_dim = q.shape
    rows = batch * seq
    delta, acc = prepare(o, do)
    dk, dv = ((torch.full_like(t, float("nan")) if poison else torch.empty_like(t))
              for t in (k, v))
    semaphores = torch.zeros(rows // config.block_m if config.dq_mode in SEMAPHORE_MODES else 1,
                             dtype=torch.int32, device=q.device)
    flat = {"q_desc": q, "do_desc": do, "k_desc": k, "v_desc": v}
    flat = {name: t.view(rows, head_dim) for name, t in flat.items()}
    flat |= {"lse_desc": lse.view(-1), "delta_desc": delta.view(-1), "dq_desc": acc}
    descs = [TensorDescriptor.from_tensor(flat[name], block, layout)
             for name, (_, block, layout) in _descriptor_specs(config, head_dim).items()]
    blocks = seq // BLOCK_N
    grid = (blocks, batch) if config.keys_fastest else (batch, blocks)
    gluon_backward_kernel[grid](
        *descs, acc, dk, dv, semaphores, seq, 0, **_constexprs(head_dim, config),
        num_warps=CONSUMER_WARPS, maxnreg=config.max_regs)
    return finish(acc, q), dk, dv


PREPARE_ROWS = 64  # rows per program of the kernels before and after the backward


def prepare(o: torch.Tensor, do: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(D, a zeroed fp32 dQ accumulator) of (batch, seq, d) o and do, flat over rows."""
    rows, head_dim = o.numel() // o.shape[-1], o.shape[-1]
    delta = torch.empty(rows, dtype=torch.float32, device=o.device)
    acc = torch.empty(rows, head_dim, dtype=torch.float32, device=o.device)
    _prepare_kernel[(rows // PREPARE_ROWS,)](o, do, delta, acc, HEAD_DIM=head_dim,
                                              ROWS=PREPARE_ROWS)
    return delta, acc


def finish(acc: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """dQ shaped and typed like q from the accumulator of the unscaled dS K."""
    dq = torch.empty_like(q)
    _finish_kernel[(acc.shape[0] // PREPARE_ROWS,)](acc, dq, q.shape[-1] ** -0.5,
                                                    HEAD_DIM=q.shape[-1], ROWS=PREPARE_ROWS)
    return dq


@triton.jit
def _prepare_kernel(Out, dOut, Delta, Acc, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """D = rowsum(O * dO) in fp32, and the rows' dQ accumulator zeroed, in one pass."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(Out + offsets).to(tl.float32)
    tl.store(Delta + rows, tl.sum(o * tl.load(dOut + offsets).to(tl.float32), axis=1))
    tl.store(Acc + offsets, tl.zeros([ROWS, HEAD_DIM], tl.float32))


@triton.jit
def _finish_kernel(Acc, dQ, scale, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """dQ = accumulator * scale, cast to dQ's type, in one pass."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(dQ + offsets, (tl.load(Acc + offsets) * scale).to(dQ.dtype.element_ty))


def build_only(emit: Callable[[dict[str, object]], None]) -> None:
    """Every config built for sm_90 as the GPU run specialises it."""
    for head_dim, configs in CONFIGS.items():
        for config in configs:
            row: dict[str, object] = {"head_dim": head_dim, "config": asdict(config),
                                      "max_regs": config.max_regs}
            constexprs = _constexprs(head_dim, config)
            signature = {"dQ": "*fp32", "dK": "*bf16", "dV": "*bf16", "semaphores": "*i32",
                         "n_q": "i32", "dq_live": "i32"}
            signature |= {name: "constexpr" for name in constexprs}
            signature |= {name: f"tensordesc<{dtype}{block},{layout!r}>" for name, (
                dtype, block, layout) in _descriptor_specs(config, head_dim).items()}
            try:
                row |= build_for_hopper(gluon_backward_kernel, signature, constexprs,
                                        num_warps=CONSUMER_WARPS, num_stages=1,
                                        maxnreg=config.max_regs)
                row["fits"] = row["shared_bytes"] <= HOPPER_SHARED_BYTES
            except Exception as error:  # recorded per config
                row["error"] = f"{type(error).__name__}: {_first_line(error)}"
            emit(row)


def measure(batch: int, seq: int, head_dim: int, emit: Callable[[dict[str, object]], None]
            ) -> None:
    torch.manual_seed(0)
    inputs = tune.make_inputs(batch, seq, head_dim, torch.bfloat16, True)
    q, k, v, o, lse, do = (inputs[n] for n in ("q", "k", "v", "o", "lse", "do"))
    base = {"batch": batch, "seq": seq, "head_dim": head_dim, "dtype": "bf16", "causal": True}
    expected = reference_grads(inputs, True)
    emit({**base, "kind": "reference", **{f"{name}_max_abs": g.abs().max().item()
                                          for name, g in zip(GRADS, expected, strict=True)}})

    tiles = launch.default_config(head_dim, torch.bfloat16)

    def dq_pass() -> tuple[torch.Tensor, torch.Tensor]:  # (dq, D): D is computed here
        return launch.backward_dq(q, k, v, o, lse, do, True, tiles.backward_dq)

    def dkdv_pass(delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return launch.backward_dkdv(q, k, v, do, lse, delta, True, tiles.backward_dkdv)

    def two_pass() -> tuple[torch.Tensor, ...]:
        dq, delta = dq_pass()
        return dq, *dkdv_pass(delta)

    ours = two_pass()
    delta = dq_pass()[1]
    forward_ms = _bench(lambda: launch.flash_forward(q, k, v, True))
    backward_ms = _bench(two_pass)
    emit({**base, "kind": "two_pass", "dq_config": astuple(tiles.backward_dq),
          "dkdv_config": astuple(tiles.backward_dkdv), **_errors(ours, expected, "vs_ref"),
          "forward_ms": forward_ms, "backward_ms": backward_ms,
          "dq_pass_ms": _bench(dq_pass), "dkdv_pass_ms": _bench(lambda: dkdv_pass(delta))})

    def variant(config: GluonConfig) -> dict[str, object]:
        first = gluon_backward(q, k, v, o, lse, do, config, poison=True)
        found: dict[str, object] = _errors(first, expected, "vs_ref")
        found |= _errors(first, ours, "vs_two_pass")
        if config.ablation:  # no dQ to check, only that none was added
            found = {name: value for name, value in found.items()
                     if not name.startswith("dq_")}
            found["dq_untouched"] = not first[0].any().item()
        else:
            second = gluon_backward(q, k, v, o, lse, do, config, poison=True)
            found["dq_run_to_run"] = _max_abs(first[0], second[0])
            del second
        del first
        found["backward_ms"] = _bench(lambda: gluon_backward(q, k, v, o, lse, do, config))
        found["backward_vs_two_pass"] = found["backward_ms"] / backward_ms
        return found

    # cuDNN before the variants: a variant's fault would leave the CUDA context unusable.
    cudnn = attempt({**base, "kind": "cudnn"}, lambda: cudnn_row(q, k, v, do, expected))
    emit(cudnn)
    timed = []
    for config in CONFIGS[head_dim]:
        row = attempt({**base, "kind": "gluon", "config": asdict(config),
                        "ablation": config.ablation}, lambda c=config: variant(c))
        timed += [row] if "backward_ms" in row and not config.ablation else []
        emit(row)
    best = min(timed, key=lambda r: r["backward_ms"]) if timed else {}
    emit({**base, "kind": "summary", "forward_ms": forward_ms,
          "prepare_finish_ms": _bench(lambda: finish(prepare(o, do)[1], q)),
          "cudnn_forward_ms": cudnn.get("forward_ms"), "two_pass_backward_ms": backward_ms,
          "best_gluon_config": best.get("config"),
          "best_gluon_backward_ms": best.get("backward_ms"),
          "cudnn_backward_ms": cudnn.get("backward_ms")})


def main() -> int:
    return run_study("attention_gluon_backward", __doc__.split("\n\n")[0], list(CONFIGS),
                     build_only, measure, seq_multiple=BLOCK_N)


if __name__ == "__main__":
    raise SystemExit(main())
