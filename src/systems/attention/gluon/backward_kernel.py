"""The fused causal backward for Hopper in Gluon (Triton's explicit dialect): FA3's schedule.

One program per (key block of 128 keys, matrix) runs the 5 tile matmuls of every query tile
at or below the block's diagonal, split into warp-specialised roles:

- a producer warp loads K and V once, then each query tile's Q, dO, LSE and D by TMA into a
  ring of shared buffers guarded by mbarriers, and gives its registers up (setmaxnreg);
- two consumer warpgroups, each owning 64 of the 128 keys, compute S^T, P^T, dP^T, dS^T and
  accumulate dV and dK in registers; they swap dS^T through shared memory and multiply the
  query tile's dQ share, each warpgroup half of it: half of its columns for a tile of 64
  query rows, 64 of its rows for a tile of 128 (`warpgroup_block`);
- a dQ writer warp (or two, each owning one of the ring's two slots) takes each
  warpgroup's half as it is handed over on the warpgroup's own named barriers and adds it
  into the fp32 dQ accumulator with a TMA bulk reduction (done by the copy engine). The
  consumers stage a half in the order they hold it (`fragment_layout`: 16-byte stores
  without bank conflicts), and the accumulator keeps that order, which `finish` reads
  back.

ORDERED adds a query tile's shares in a fixed order through one int32 semaphore per query
tile: a writer waits until the tile's count says it is its key block's turn, waits for its
own reductions to land in global memory, then bumps the count. dQ is then bit-for-bit the
same from run to run. The order follows the SCHEDULE, so that a program waits only for key
blocks of its matrix launched before it (every wait ends) and, started as the schedule
starts them, those reach each query tile about a step ahead of it (little wait):

- "shortest_first": key blocks launched last to first (the shortest programs first), each
  walking its query tiles up from the diagonal; a tile's shares added last to first.
- "alternating": even matrices as "shortest_first"; odd matrices launch first to last
  (the longest first), walk their query tiles down to the diagonal and add first to
  last. The long programs of odd matrices fill the SMs the short ones of even matrices
  free, so the last wave is not left to the longest programs.
- "longest_first": key blocks first to last, tiles up, shares last to first: a wait ends
  only if every key block of the matrix is resident at once, which the launch code checks
  (`backward._check_launch_order`). Unordered, it is the best packing.
- "descending": every matrix as the odd ones alternating, the matrices' programs started
  in turn (key block 0 of every matrix, then key block 1, ...), so that the longest start
  first across matrices and a wave holds a few key blocks of each. A matrix's resident
  key blocks reach each tile together, so a tile's shares queue one behind the other
  (once: then they keep a step apart); with CHAINS > 1 key block b adds into accumulator
  b % CHAINS, on chains of its own, which the finish adds in order: the queues are CHAINS
  times shorter.

`prepare` (D = rowsum(O * dO) and the zeroed accumulators) and `finish` (dQ = the
accumulators' sum * scale, cast) are plain Triton kernels launched before and after.
"""

from __future__ import annotations

import triton
import triton.language as tl
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

import systems.kernel_runtime.interpreter  # noqa: F401 - sets TRITON_INTERPRET before the kernels exist

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
BLOCK_N = 128  # keys per program: 64 per consumer warpgroup
CONSUMER_WARPS = 8
KEY_BLOCK: gl.constexpr = gl.constexpr(BLOCK_N)
# Named barriers of the half hand-off, of 160 threads each (a consumer warpgroup and the
# writer warp; ids 0 and 1 are Triton's): the writer waits on FULL + 2 * slot + warpgroup
# for a half, the warpgroup on EMPTY + 2 * slot + itself for the slot to be free again.
HANDOFF_THREADS: gl.constexpr = gl.constexpr(160)
FULL_BARRIER: gl.constexpr = gl.constexpr(8)
EMPTY_BARRIER: gl.constexpr = gl.constexpr(12)
# Triton 3.6 names the CTA-wide barrier `thread_barrier`, later releases `barrier`.
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@builtin
def _tma_reduce_add(desc, coord, src, _semantic=None):
    # cp.reduce.async.bulk.tensor (add) from shared memory: Gluon's builder has the op, its
    # hopper `tma` module does not wrap it.
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle,
                                              coord, src.handle)


# Inline PTX for what Gluon does not wrap. Each returns a dummy value (inline asm must
# return one); none but the thread index is pure, so none is dropped or moved across
# memory operations.
@gluon.jit
def _thread_index():
    return gl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r", [], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def named_sync(barrier, threads):
    """bar.sync on a named barrier of `threads` threads (a multiple of 32): waits for the
    others."""
    gl.inline_asm_elementwise("bar.sync $1, $2; mov.u32 $0, 0;", "=r,r,r,~{memory}",
                              [barrier, threads], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def named_arrive(barrier, threads):
    """bar.arrive on a named barrier of `threads` threads: signals, never waits."""
    gl.inline_asm_elementwise("bar.arrive $1, $2; mov.u32 $0, 0;", "=r,r,r,~{memory}",
                              [barrier, threads], dtype=gl.int32, is_pure=False, pack=1)


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


@gluon.jit
def _program(BLOCK: gl.constexpr, SCHEDULE: gl.constexpr):
    """(matrix, first key, descending) of this program. `descending` is 1 where it walks
    its query tiles down to the diagonal: odd matrices when alternating. Those, and all
    under "longest_first", launch key blocks first to last. Each partition asks for
    itself rather than taking them as arguments."""
    if SCHEDULE == "descending":
        # Programs start in grid order (x fastest): read that order as key blocks slowest,
        # matrices fastest, so that every matrix starts its longest programs first and a
        # wave holds a few key blocks of each matrix, not all of one.
        start = gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)
        return start % gl.num_programs(1), start // gl.num_programs(1) * BLOCK, 1
    bh = gl.program_id(1)
    descending = (bh % 2) * (SCHEDULE == "alternating")
    longest = descending + (SCHEDULE == "longest_first")
    pid = gl.program_id(0)
    key_block = pid + (1 - longest) * (gl.num_programs(0) - 1 - 2 * pid)
    return bh, key_block * BLOCK, descending


@gluon.jit
def _tile_of(step, n_tiles, descending):
    """The query tile (from the key block's diagonal) a program takes at `step`: up from
    the diagonal, or down to it where `descending` (0 or 1)."""
    return step + descending * (n_tiles - 1 - 2 * step)


@gluon.constexpr_function
def mma_layout(rows, cols, num_warps):
    # Warpgroups stack along rows while each keeps >= 64 of them (FA3's split of the keys
    # for S^T, dK, dV; dQ of a 128-row tile), then split the columns (dQ of a 64-row tile:
    # half of d each).
    along_rows = min(num_warps, max(4, rows // 16))
    along_cols = num_warps // along_rows
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[along_rows, along_cols],
                                     instr_shape=[16, cols // along_cols, 16])


@gluon.constexpr_function
def warpgroup_block(rows, cols, num_warps):
    """[rows, cols] of the block of a rows x cols `mma_layout` tile that one warpgroup
    holds: the part of a dQ share each consumer warpgroup hands over (dq_desc's box)."""
    along_rows, along_cols = mma_layout(rows, cols, num_warps).warps_per_cta
    return [rows * 4 // along_rows, cols // along_cols]


@gluon.constexpr_function
def fragment_layout(rows, cols, num_warps):
    """A shared layout of a rows x cols `mma_layout` tile in the order its threads hold it
    (FA3's and FA4's dQ staging): a thread's 4 registers of a row pair are 16 contiguous
    bytes, a warp's 512 (stores without bank conflicts; rows of a swizzled layout take
    two ways per 8-byte store), and each warpgroup's block (`warpgroup_block`) is one
    contiguous chunk, which a TMA copies without a swizzle. `_fragment_offset` inverts
    it for `finish_kernel`."""
    block_rows, block_cols = warpgroup_block(rows, cols, num_warps)
    assert num_warps == 8 and block_rows == 64 and block_cols >= 8, (rows, cols, num_warps)
    bases = [[0, 1], [8, 0], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0], [16, 0], [32, 0]]
    bases += [[0, 8 << b] for b in range(block_cols.bit_length() - 4)]
    bases.append([64, 0] if block_cols == cols else [0, block_cols])
    return gl.SharedLinearLayout(offset_bases=bases)


@gluon.jit
def _load_partition(descs, tail_descs, bufs, tails, bars, n_q, SCHEDULE: gl.constexpr,
                    TAIL: gl.constexpr):
    """Producer: K and V once, then each query tile's Q, dO, LSE and D into the ring (with
    TAIL, each also its tail columns, through descriptors of their own)."""
    q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc = descs
    bh, k_start, descending = _program(k_desc.block_type.shape[0], SCHEDULE)
    q_bufs, do_bufs, lse_bufs, delta_bufs, k_smem, v_smem = bufs
    ready, empty, kv_bar = bars
    NUM_STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1]
    HEAD_DIM: gl.constexpr = q_bufs.type.shape[2]
    row0 = bh * n_q
    kv_bytes: gl.constexpr = 2 * k_desc.block_type.nbytes
    tile_bytes: gl.constexpr = 2 * q_desc.block_type.nbytes + 2 * lse_desc.block_type.nbytes
    if TAIL > 0:
        q_tail_desc, do_tail_desc, k_tail_desc, v_tail_desc, _ = tail_descs
        q_tails, do_tails, k_tail, v_tail = tails
        mbarrier.expect(kv_bar, kv_bytes + 2 * k_tail_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_tail_desc, [row0 + k_start, HEAD_DIM], kv_bar,
                                        k_tail)
        tma.async_copy_global_to_shared(v_tail_desc, [row0 + k_start, HEAD_DIM], kv_bar,
                                        v_tail)
    else:
        mbarrier.expect(kv_bar, kv_bytes)
    tma.async_copy_global_to_shared(k_desc, [row0 + k_start, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [row0 + k_start, 0], kv_bar, v_smem)
    n_tiles = (n_q - k_start) // BLOCK_M
    for i in range(n_tiles):
        stage = i % NUM_STAGES
        # Barriers start as if phase 1 completed: the first pass over the ring waits on nothing.
        mbarrier.wait(empty.index(stage), ((i // NUM_STAGES) & 1) ^ 1)
        row = row0 + k_start + _tile_of(i, n_tiles, descending) * BLOCK_M
        bar = ready.index(stage)
        if TAIL > 0:
            mbarrier.expect(bar, tile_bytes + 2 * q_tail_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_tail_desc, [row, HEAD_DIM], bar,
                                            q_tails.index(stage))
            tma.async_copy_global_to_shared(do_tail_desc, [row, HEAD_DIM], bar,
                                            do_tails.index(stage))
        else:
            mbarrier.expect(bar, tile_bytes)
        tma.async_copy_global_to_shared(q_desc, [row, 0], bar, q_bufs.index(stage))
        tma.async_copy_global_to_shared(do_desc, [row, 0], bar, do_bufs.index(stage))
        tma.async_copy_global_to_shared(lse_desc, [row], bar, lse_bufs.index(stage))
        tma.async_copy_global_to_shared(delta_desc, [row], bar, delta_bufs.index(stage))


@gluon.jit
def _over_head_dim(a, b, a_tail, b_tail, acc, use_acc, ASYNC: gl.constexpr,
                   TAIL: gl.constexpr):
    """a b^T over the head dim, its tail columns (TAIL) a second matmul into the same
    accumulator: S^T = K Q^T, dP^T = V dO^T."""
    acc = warpgroup_mma(a, b.permute((1, 0)), acc, use_acc=use_acc, is_async=ASYNC)
    if TAIL > 0:
        acc = warpgroup_mma(a_tail, b_tail.permute((1, 0)), acc, is_async=ASYNC)
    return acc


@gluon.jit
def _dq_share(ds_s, k_smem, k_tail, TAIL: gl.constexpr, ASYNC: gl.constexpr):
    """The query tile's dQ share dS K (unscaled) over both warpgroups' keys, and with TAIL
    its tail columns' (else dq again: never a None, Triton 3.6); each warpgroup holds its
    block of it (`warpgroup_block`)."""
    BLOCK_M: gl.constexpr = ds_s.type.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.type.shape[1]
    zero_q = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32,
                      mma_layout(BLOCK_M, HEAD_DIM, gl.num_warps()))
    dq = warpgroup_mma(ds_s.permute((1, 0)), k_smem, zero_q, use_acc=False, is_async=ASYNC)
    dq_tail = dq
    if TAIL > 0:
        zero_tail = gl.zeros([BLOCK_M, TAIL], gl.float32,
                             mma_layout(BLOCK_M, TAIL, gl.num_warps()))
        dq_tail = warpgroup_mma(ds_s.permute((1, 0)), k_tail, zero_tail, use_acc=False,
                                is_async=ASYNC)
    return dq, dq_tail


@gluon.constexpr_function
def _in_thread_order(held, staged):
    """Whether the shared layout `staged` lays a tile out in the order the linear layout
    `held` gives it to threads: registers 0 and 1, lanes, the warpgroup's warps, the other
    registers, then warpgroups (`fragment_layout`)."""
    reg, lane, warp = (list(map(list, bases)) for bases in
                       (held.reg_bases, held.lane_bases, held.warp_bases))
    return list(map(list, staged.offset_bases)) == reg[:2] + lane + warp[:2] + reg[2:] + warp[2:]


@gluon.jit
def _share_view(slot, ROWS: gl.constexpr, COLS: gl.constexpr):
    """A slot of dQ shares (rows of 32 floats, as the writers' TMA reads them) as the ROWS x
    COLS share that the consumers store, in `fragment_layout`."""
    layout: gl.constexpr = fragment_layout(ROWS, COLS, gl.num_warps())
    held: gl.constexpr = gl.to_linear_layout(mma_layout(ROWS, COLS, gl.num_warps()), [ROWS, COLS])
    gl.static_assert(_in_thread_order(held, layout),
                     "fragment_layout no longer follows the accumulator's register layout")
    # the same bytes seen through another shape and layout (Gluon names it privately)
    return slot._reinterpret(gl.float32, [ROWS, COLS], layout)


@gluon.jit
def _hand_over(dq, dq_tail, dq_bufs, dq_tails, i, TAIL: gl.constexpr):
    """This warpgroup's block of step i's dQ share (with TAIL, its tail's too) into slot
    i % 2, once the writers have reduced the slot's share of two steps ago."""
    own = (i % 2) * 2 + _thread_index() // 128
    if i >= 2:
        named_sync(EMPTY_BARRIER + own, HANDOFF_THREADS)
    BLOCK_M: gl.constexpr = dq.type.shape[0]
    _share_view(dq_bufs.index(i % 2), BLOCK_M, dq.type.shape[1]).store(dq)
    if TAIL > 0:
        _share_view(dq_tails.index(i % 2), BLOCK_M, TAIL).store(dq_tail)
    fence_async_shared()
    named_arrive(FULL_BARRIER + own, HANDOFF_THREADS)


@gluon.jit
def _tile(i, tile, grads, bufs, tails, bars, ds_bufs, dq_bufs, dq_tails, keys, k_start,
          qk_scale, HEAD_DIM: gl.constexpr, MASKED: gl.constexpr, ASYNC: gl.constexpr,
          DQ_FIRST: gl.constexpr, TAIL: gl.constexpr):
    """Step i, query tile `tile` (from the diagonal): dV += P^T dO, dK += dS^T Q, and the
    tile's dQ share dS K (unscaled) handed to the writers; `grads` is (dK, dV), and under
    TAIL their tail columns' after them. ASYNC overlaps the softmax with dP^T and the
    dS^T store with dV and dK; DQ_FIRST (with ASYNC) issues dQ between dV and dK."""
    dk = grads[0]
    dv = grads[1]
    q_bufs, do_bufs, lse_bufs, delta_bufs, k_smem, v_smem = bufs
    ready, empty, kv_bar = bars
    NUM_STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[0]
    # Each of S^T, dP^T, dV, dK is one async group per part of the head dim.
    PARTS: gl.constexpr = 2 if TAIL > 0 else 1
    s_layout: gl.constexpr = mma_layout(BLOCK_N, BLOCK_M, gl.num_warps())
    kv_layout: gl.constexpr = mma_layout(BLOCK_N, HEAD_DIM, gl.num_warps())
    # P^T and dS^T feed the dV and dK matmuls from registers, as FA3 does.
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    stage = i % NUM_STAGES
    q_start = k_start + tile * BLOCK_M
    mbarrier.wait(ready.index(stage), (i // NUM_STAGES) & 1)
    q_s = q_bufs.index(stage)
    do_s = do_bufs.index(stage)
    if TAIL > 0:
        q_tails, do_tails, k_tail, v_tail = tails
        q_tail_s = q_tails.index(stage)
        do_tail_s = do_tails.index(stage)
    else:
        q_tail_s, do_tail_s, k_tail, v_tail = None, None, None, None
    # LSE and D are rows of BLOCK_M / 4 registers a thread each. For 64 query rows they are
    # loaded apart (FA4's order): LSE before dP^T's matmuls fill the queue the loads wait
    # in, D while the softmax runs; loaded together once both matmuls are issued, they
    # stalled the consumers most on that queue. For 128 they would spill, so D seeds dP^T's
    # accumulator instead (the tensor cores give dP^T - D, and D's registers are free
    # before the softmax) and LSE is loaded where the softmax takes it.
    SEED_DP: gl.constexpr = BLOCK_M >= 128
    zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    s_t = _over_head_dim(k_smem, q_s, k_tail, q_tail_s, zero_s, False, ASYNC, TAIL)
    if SEED_DP:
        minus_delta = zero_s - gl.expand_dims(delta_bufs.index(stage).load(row_layout), 0)
        dp_t = _over_head_dim(v_smem, do_s, v_tail, do_tail_s, minus_delta, True, ASYNC, TAIL)
    else:
        lse2 = gl.expand_dims(lse_bufs.index(stage).load(row_layout) * LOG2E, 0)
        dp_t = _over_head_dim(v_smem, do_s, v_tail, do_tail_s, zero_s, False, ASYNC, TAIL)
    if ASYNC:  # the softmax runs while dP^T is in flight
        s_t = warpgroup_mma_wait(PARTS, deps=(s_t,))
    if SEED_DP:
        lse2 = gl.expand_dims(lse_bufs.index(stage).load(row_layout) * LOG2E, 0)
    p_t = gl.exp2(s_t * qk_scale - lse2)
    if MASKED:  # the key block's diagonal tiles
        rows = q_start + gl.arange(0, BLOCK_M, row_layout)
        p_t = gl.where(gl.expand_dims(rows, 0) >= gl.expand_dims(keys, 1), p_t, 0.0)
    p_op = gl.convert_layout(p_t.to(gl.bfloat16), a_layout)
    if not SEED_DP:
        delta = gl.expand_dims(delta_bufs.index(stage).load(row_layout), 0)
    if ASYNC:
        dp_t = warpgroup_mma_wait(0, deps=(dp_t,))
    # dQ needs all 128 keys' dS: both warpgroups put theirs in shared memory. Two buffers,
    # so one warpgroup's next store cannot overwrite what the other still multiplies.
    ds_s = ds_bufs.index(i % 2)
    if DQ_FIRST:
        # FA3's order: dS^T stored first, then dV, dQ and dK issued back to back, each
        # waited for only once the next is in flight, and dQ handed over while dK runs,
        # so that no barrier or store leaves the tensor cores idle. dV (P^T from
        # registers, dO) runs while the store is fenced and both halves meet.
        if not SEED_DP:
            dp_t = dp_t - delta
        ds_t = (p_t * dp_t).to(gl.bfloat16)
        ds_op = gl.convert_layout(ds_t, a_layout)
        ds_s.store(ds_t)
        dv = warpgroup_mma(p_op, do_s, dv, is_async=True)
        if TAIL > 0:
            dv_tail = warpgroup_mma(p_op, do_tail_s, grads[3], is_async=True)
        fence_async_shared()
        _cta_barrier()  # both halves of dS^T stored
        dq, dq_tail = _dq_share(ds_s, k_smem, k_tail, TAIL, True)
        if TAIL > 0:
            dv, dv_tail, p_op = warpgroup_mma_wait(PARTS, deps=(dv, dv_tail, p_op))
            dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)
            dk_tail = warpgroup_mma(ds_op, q_tail_s, grads[2], is_async=True)
            dq, dq_tail = warpgroup_mma_wait(PARTS, deps=(dq, dq_tail))
        else:
            dv, p_op = warpgroup_mma_wait(PARTS, deps=(dv, p_op))
            dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)
            dq = warpgroup_mma_wait(PARTS, deps=(dq,))
        _hand_over(dq, dq_tail, dq_bufs, dq_tails, i, TAIL)
        if TAIL > 0:
            dk, dk_tail, ds_op = warpgroup_mma_wait(0, deps=(dk, dk_tail, ds_op))
        else:
            dk, ds_op = warpgroup_mma_wait(0, deps=(dk, ds_op))
        mbarrier.arrive(empty.index(stage), count=1)  # both warpgroups are past Q and dO
    else:
        dv = warpgroup_mma(p_op, do_s, dv, is_async=ASYNC)
        if TAIL > 0:
            dv_tail = warpgroup_mma(p_op, do_tail_s, grads[3], is_async=ASYNC)
        if not SEED_DP:
            dp_t = dp_t - delta
        ds_t = (p_t * dp_t).to(gl.bfloat16)
        ds_op = gl.convert_layout(ds_t, a_layout)
        dk = warpgroup_mma(ds_op, q_s, dk, is_async=ASYNC)
        if TAIL > 0:
            dk_tail = warpgroup_mma(ds_op, q_tail_s, grads[2], is_async=ASYNC)
        ds_s.store(ds_t)
        fence_async_shared()  # dS^T (and the LSE/D reads) ordered before async-proxy use
        if ASYNC:  # register operands stay live until their matmuls are done
            if TAIL > 0:
                dv, dk, dv_tail, dk_tail, p_op, ds_op = warpgroup_mma_wait(
                    0, deps=(dv, dk, dv_tail, dk_tail, p_op, ds_op))
            else:
                dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
        _cta_barrier()  # both halves stored; both warpgroups are past Q and dO
        mbarrier.arrive(empty.index(stage), count=1)  # dQ's matmul reads only dS^T and K
        dq, dq_tail = _dq_share(ds_s, k_smem, k_tail, TAIL, False)
        _hand_over(dq, dq_tail, dq_bufs, dq_tails, i, TAIL)
    return (dk, dv, dk_tail, dv_tail) if TAIL > 0 else (dk, dv)  # never a None: Triton 3.6


@gluon.jit
def _reduce_chunk(desc, slot, tile_row, half: gl.constexpr):
    """Adds warpgroup `half`'s block of a dQ share (one contiguous chunk, desc's box of rows
    of 32 floats) into the accumulator, whose query tile's chunks start at row `tile_row`."""
    CHUNK: gl.constexpr = desc.block_type.shape[0]
    _tma_reduce_add(desc, [tile_row + half * CHUNK, 0], slot.slice(half * CHUNK, CHUNK, dim=0))


@gluon.jit
def _dq_partition(dq_desc, dq_bufs, dq_tail_desc, dq_tails, semaphores, n_q,
                  BLOCK_M: gl.constexpr, SCHEDULE: gl.constexpr, ORDERED: gl.constexpr,
                  CHAINS: gl.constexpr, WRITER: gl.constexpr, WRITERS: gl.constexpr,
                  TAIL: gl.constexpr):
    """dQ writer WRITER of WRITERS (steps WRITER, WRITER + WRITERS, ...): each tile's two
    halves reduced into the key block's accumulator (of CHAINS) as their warpgroups hand
    them over (with TAIL, each half's tail columns too); ORDERED first waits for the key
    blocks before this one in the tile's order on its chain to have added theirs
    (`semaphores`: one per query tile of every matrix and chain, counting the key blocks
    done). A query tile's shares sit in its accumulator rows as the consumers stage them
    (`fragment_layout`), its chunks of rows of 32 floats in turn: each warpgroup's block,
    then each one's tail."""
    CHUNK: gl.constexpr = dq_desc.block_type.shape[0]
    TAIL_CHUNK: gl.constexpr = dq_tail_desc.block_type.shape[0] if TAIL > 0 else 0
    TILE_CHUNKS: gl.constexpr = 2 * (CHUNK + TAIL_CHUNK)  # rows of 32 floats per query tile
    bh, k_start, descending = _program(KEY_BLOCK, SCHEDULE)
    key_block = k_start // KEY_BLOCK
    matrix = (key_block % CHAINS) * gl.num_programs(1) + bh  # in the stacked accumulators
    row0 = matrix * n_q + k_start
    n_tiles = (n_q - k_start) // BLOCK_M
    semaphores = semaphores + matrix * (n_q // BLOCK_M)
    for i in range(WRITER, n_tiles, WRITERS):
        tile = _tile_of(i, n_tiles, descending)
        q_start = k_start + tile * BLOCK_M
        if ORDERED:  # walking down, key blocks add first to last; up, the diagonal's first
            last_key_block = (q_start + BLOCK_M - 1) // KEY_BLOCK
            turn = (last_key_block - key_block
                    + descending * (2 * key_block - last_key_block)) // CHAINS
            _wait_turn(semaphores + q_start // BLOCK_M, turn)
        tile_row = (row0 // BLOCK_M + tile) * TILE_CHUNKS
        for half in gl.static_range(2):
            named_sync(FULL_BARRIER + (i % 2) * 2 + half, HANDOFF_THREADS)
            _reduce_chunk(dq_desc, dq_bufs.index(i % 2), tile_row, half)
            if TAIL > 0:
                _reduce_chunk(dq_tail_desc, dq_tails.index(i % 2), tile_row + 2 * CHUNK, half)
        tma.store_wait(0)  # both halves read: the slot may be refilled
        if i < n_tiles - 2:  # the consumers wait on a slot from their third tile on
            for half in gl.static_range(2):
                named_arrive(EMPTY_BARRIER + (i % 2) * 2 + half, HANDOFF_THREADS)
        if ORDERED:
            _pass_turn(semaphores + q_start // BLOCK_M)


@gluon.jit
def _walk(grads, n_tiles, bufs, tails, bars, ds_bufs, dq_bufs, dq_tails, keys, k_start,
          qk_scale, HEAD_DIM: gl.constexpr, ASYNC: gl.constexpr, DQ_FIRST: gl.constexpr,
          DESCENDING: gl.constexpr, TAIL: gl.constexpr):
    """Every query tile of the key block, up from the diagonal or down to it: the
    diagonal's tiles (masked) come first walking up, last walking down."""
    BLOCK_M: gl.constexpr = bufs[0].type.shape[1]
    n_diagonal: gl.constexpr = KEY_BLOCK // BLOCK_M
    first_masked = n_tiles - n_diagonal if DESCENDING else 0
    for i in range(first_masked):
        grads = _tile(i, _tile_of(i, n_tiles, DESCENDING), grads, bufs, tails, bars, ds_bufs,
                      dq_bufs, dq_tails, keys, k_start, qk_scale, HEAD_DIM, False, ASYNC,
                      DQ_FIRST, TAIL)
    for i in range(first_masked, first_masked + n_diagonal):
        grads = _tile(i, _tile_of(i, n_tiles, DESCENDING), grads, bufs, tails, bars, ds_bufs,
                      dq_bufs, dq_tails, keys, k_start, qk_scale, HEAD_DIM, True, ASYNC,
                      DQ_FIRST, TAIL)
    for i in range(first_masked + n_diagonal, n_tiles):
        grads = _tile(i, _tile_of(i, n_tiles, DESCENDING), grads, bufs, tails, bars, ds_bufs,
                      dq_bufs, dq_tails, keys, k_start, qk_scale, HEAD_DIM, False, ASYNC,
                      DQ_FIRST, TAIL)
    return grads


@gluon.jit
def _store_rows(base, tile, rows, col, ROW: gl.constexpr):
    """tile (a key block's rows x its columns) as bf16 into rows of ROW elements from
    column `col`."""
    cols = col + gl.arange(0, tile.type.shape[1], gl.SliceLayout(0, tile.type.layout))
    gl.store(base + gl.expand_dims(rows, 1) * ROW + gl.expand_dims(cols, 0),
             tile.to(gl.bfloat16))


@gluon.jit
def _compute_partition(bufs, tails, bars, ds_bufs, dq_bufs, dq_tails, dK, dV, n_q,
                       SCHEDULE: gl.constexpr, SM_SCALE: gl.constexpr,
                       HEAD_DIM: gl.constexpr, ASYNC: gl.constexpr, DQ_FIRST: gl.constexpr,
                       TAIL: gl.constexpr):
    """Consumers (the default partition, two warpgroups): every query tile at or below the
    key block's diagonal, then dK (scaled) and dV stored as bf16."""
    q_bufs, do_bufs, lse_bufs, delta_bufs, k_smem, v_smem = bufs
    ready, empty, kv_bar = bars
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[0]
    s_layout: gl.constexpr = mma_layout(BLOCK_N, BLOCK_M, gl.num_warps())
    kv_layout: gl.constexpr = mma_layout(BLOCK_N, HEAD_DIM, gl.num_warps())
    qk_scale = SM_SCALE * LOG2E
    bh, k_start, descending = _program(BLOCK_N, SCHEDULE)
    keys = k_start + gl.arange(0, BLOCK_N, gl.SliceLayout(1, s_layout))

    zero = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    if TAIL > 0:
        zero_tail = gl.zeros([BLOCK_N, TAIL], gl.float32,
                             mma_layout(BLOCK_N, TAIL, gl.num_warps()))
        grads = (zero, zero, zero_tail, zero_tail)
    else:
        grads = (zero, zero)
    mbarrier.wait(kv_bar, 0)
    n_tiles = (n_q - k_start) // BLOCK_M
    # Each direction's loops built for it: one set of loops with the direction a runtime
    # value spills more at d = 128, where dK and dV fill the registers.
    if descending:
        grads = _walk(grads, n_tiles, bufs, tails, bars, ds_bufs, dq_bufs, dq_tails, keys,
                      k_start, qk_scale, HEAD_DIM, ASYNC, DQ_FIRST, True, TAIL)
    else:
        grads = _walk(grads, n_tiles, bufs, tails, bars, ds_bufs, dq_bufs, dq_tails, keys,
                      k_start, qk_scale, HEAD_DIM, ASYNC, DQ_FIRST, False, TAIL)

    ROW: gl.constexpr = HEAD_DIM + TAIL
    matrix = (bh * n_q).to(gl.int64) * ROW
    rows = k_start + gl.arange(0, BLOCK_N, gl.SliceLayout(1, kv_layout))
    _store_rows(dK + matrix, grads[0] * SM_SCALE, rows, 0, ROW)
    _store_rows(dV + matrix, grads[1], rows, 0, ROW)
    if TAIL > 0:
        tail_rows = gl.convert_layout(rows, gl.SliceLayout(1, grads[2].type.layout))
        _store_rows(dK + matrix, grads[2] * SM_SCALE, tail_rows, HEAD_DIM, ROW)
        _store_rows(dV + matrix, grads[3], tail_rows, HEAD_DIM, ROW)


@gluon.jit
def gluon_backward_kernel(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, dq_desc,
                          q_tail_desc, do_tail_desc, k_tail_desc, v_tail_desc, dq_tail_desc,
                          dK, dV, semaphores, n_q, SM_SCALE: gl.constexpr,
                          NUM_STAGES: gl.constexpr, PRODUCER_WARPS: gl.constexpr,
                          WORKER_REGS: gl.constexpr, ASYNC_MMA: gl.constexpr,
                          DQ_FIRST: gl.constexpr, ORDERED: gl.constexpr, SCHEDULE: gl.constexpr,
                          CHAINS: gl.constexpr, WRITERS: gl.constexpr, TAIL: gl.constexpr):
    """Grid (key blocks, matrices); causal; rows of all matrices stacked ((bh * n_q, d)
    descriptors, n_q a multiple of BLOCK_N). SCHEDULE (one of those above) sets the order
    key blocks launch in, the order each walks its query tiles, and, ORDERED, the order of
    a tile's shares. dq_desc covers CHAINS fp32 (bh * n_q, d) accumulators stacked, zeroed,
    as rows of 32 floats, in boxes of the block of a query tile's share that a warpgroup
    holds (`warpgroup_block`, staged in `fragment_layout`); dK, dV are bf16; semaphores
    int32 (CHAINS, bh, n_q / BLOCK_M), zero (read only if ORDERED). A head dim d that is
    not a power of two runs as its first HEAD_DIM columns (the descriptors' boxes) and a
    tail of TAIL (80 = 64 + 16, 96 = 64 + 32): the `*_tail_desc`s read the same rows from
    column HEAD_DIM (dq_tail_desc: after each query tile's first HEAD_DIM columns), and
    each matmul over or along the head dim is two. TAIL = 0: no tail, and the tail
    descriptors are None."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK: gl.constexpr = k_desc.block_type.shape[0]
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM],
                                       q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM],
                                        do_desc.layout)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_M], lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_M],
                                           delta_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [BLOCK, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [BLOCK, HEAD_DIM], v_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, BLOCK_M],
                                                                   gl.bfloat16)
    ds_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK, BLOCK_M], ds_layout)
    # Two slots of a whole dQ share, each as the writers' TMA reads it: two chunks (one per
    # warpgroup, dq_desc's box) of rows of 32 floats, which the consumers store through
    # `_share_view`.
    CHUNK: gl.constexpr = dq_desc.block_type.shape[0]
    dq_bufs = gl.allocate_shared_memory(gl.float32, [2, 2 * CHUNK, dq_desc.block_type.shape[1]],
                                        dq_desc.layout)
    if TAIL > 0:
        q_tails = gl.allocate_shared_memory(q_tail_desc.dtype, [NUM_STAGES, BLOCK_M, TAIL],
                                            q_tail_desc.layout)
        do_tails = gl.allocate_shared_memory(do_tail_desc.dtype, [NUM_STAGES, BLOCK_M, TAIL],
                                             do_tail_desc.layout)
        k_tail = gl.allocate_shared_memory(k_tail_desc.dtype, [BLOCK, TAIL], k_tail_desc.layout)
        v_tail = gl.allocate_shared_memory(v_tail_desc.dtype, [BLOCK, TAIL], v_tail_desc.layout)
        TAIL_CHUNK: gl.constexpr = dq_tail_desc.block_type.shape[0]
        dq_tails = gl.allocate_shared_memory(
            gl.float32, [2, 2 * TAIL_CHUNK, dq_tail_desc.block_type.shape[1]],
            dq_tail_desc.layout)
        tails = (q_tails, do_tails, k_tail, v_tail)
        tail_descs = (q_tail_desc, do_tail_desc, k_tail_desc, v_tail_desc, dq_tail_desc)
    else:  # placeholders that nothing reads (a partition's arguments cannot be None)
        tails = (q_bufs, do_bufs, k_smem, v_smem)
        dq_tails = dq_bufs
        tail_descs = (q_desc, do_desc, k_desc, v_desc, dq_desc)
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
    # Gluon keeps neither a partition list nor a tuple of constexprs in a variable: one
    # warp_specialize call per writer count, each spelling its arguments out.
    if WRITERS == 1:
        gl.warp_specialize([
            (_compute_partition, (bufs, tails, bars, ds_bufs, dq_bufs, dq_tails, dK, dV, n_q,
                                  SCHEDULE, SM_SCALE, HEAD_DIM, ASYNC_MMA, DQ_FIRST,
                                  TAIL)),
            (_load_partition, (descs, tail_descs, bufs, tails, bars, n_q, SCHEDULE, TAIL)),
            (_dq_partition, (dq_desc, dq_bufs, tail_descs[4], dq_tails, semaphores, n_q,
                             BLOCK_M, SCHEDULE, ORDERED, CHAINS, 0, 1, TAIL)),
        ], [PRODUCER_WARPS, 1], [WORKER_REGS, WORKER_REGS])
    else:  # two writers, each on its slot
        gl.warp_specialize([
            (_compute_partition, (bufs, tails, bars, ds_bufs, dq_bufs, dq_tails, dK, dV, n_q,
                                  SCHEDULE, SM_SCALE, HEAD_DIM, ASYNC_MMA, DQ_FIRST,
                                  TAIL)),
            (_load_partition, (descs, tail_descs, bufs, tails, bars, n_q, SCHEDULE, TAIL)),
            (_dq_partition, (dq_desc, dq_bufs, tail_descs[4], dq_tails, semaphores, n_q,
                             BLOCK_M, SCHEDULE, ORDERED, CHAINS, 0, 2, TAIL)),
            (_dq_partition, (dq_desc, dq_bufs, tail_descs[4], dq_tails, semaphores, n_q,
                             BLOCK_M, SCHEDULE, ORDERED, CHAINS, 1, 2, TAIL)),
        ], [PRODUCER_WARPS, 1, 1], [WORKER_REGS] * 3)


@triton.jit
def _row_block(ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """(rows, cols, offsets, mask) of this program's ROWS rows of HEAD_DIM columns, the
    columns as a power of two wide with those past HEAD_DIM masked off."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, triton.next_power_of_2(HEAD_DIM))
    offsets = rows[:, None] * HEAD_DIM + cols[None, :]
    return rows, cols, offsets, (cols < HEAD_DIM)[None, :]


@triton.jit
def _chain_stride(ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Elements from one of the stacked dQ accumulators to the next (the grid covers one)."""
    return tl.num_programs(0).to(tl.int64) * ROWS * HEAD_DIM


@triton.jit
def prepare_kernel(Out, dOut, Delta, Acc, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
                   CHAINS: tl.constexpr):
    """D = rowsum(O * dO) in fp32, and the rows of each of the CHAINS dQ accumulators
    zeroed, in one pass."""
    rows, _, offsets, mask = _row_block(ROWS, HEAD_DIM)
    o = tl.load(Out + offsets, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(dOut + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(Delta + rows, tl.sum(o * do, axis=1))
    for chain in tl.static_range(CHAINS):
        tl.store(Acc + chain * _chain_stride(ROWS, HEAD_DIM) + offsets,
                 tl.zeros(offsets.shape, tl.float32), mask=mask)


@triton.jit
def _fragment_offset(r, c, cols, BLOCK_M: tl.constexpr):
    """Where element (r, c) of a query tile's dQ share of `cols` columns sits in it as the
    consumers stage it (`fragment_layout`, read back bit by bit): in the chunk of its
    warpgroup's block of 64 rows and `block_cols` columns, at its register (c bit 0, r bit
    3), lane (c bits 1-2, r bits 0-2), warp (r bits 4-5), then register again (c bits
    3 up)."""
    block_cols = cols * BLOCK_M // 128  # 64-row tiles split the columns, 128-row the rows
    c_in = c % block_cols
    warpgroup = r // 64 + c // block_cols
    within = ((c_in & 1) | ((r >> 3) & 1) << 1 | ((c_in >> 1) & 3) << 2 | (r & 7) << 4
              | ((r >> 4) & 3) << 7 | (c_in >> 3) << 9)
    return warpgroup * 64 * block_cols + within


@triton.jit
def finish_kernel(Acc, dQ, scale, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
                  CHAINS: tl.constexpr, BLOCK_M: tl.constexpr, MAIN: tl.constexpr):
    """dQ = the CHAINS accumulators added in order, times scale, cast to dQ's type, in one
    pass. The accumulators hold each query tile of BLOCK_M rows as the backward's writers
    add it: its shares' first MAIN columns, then their tail (`_fragment_offset`)."""
    rows, cols, offsets, mask = _row_block(ROWS, HEAD_DIM)
    cols = cols[None, :]
    r = rows[:, None] % BLOCK_M
    main = cols < MAIN
    TAIL: tl.constexpr = HEAD_DIM - MAIN if HEAD_DIM > MAIN else MAIN  # never 0: a divisor
    part = tl.where(main, 0, BLOCK_M * MAIN) + _fragment_offset(
        r, tl.where(main, cols, cols - MAIN), tl.where(main, MAIN, TAIL), BLOCK_M)
    staged = (rows[:, None] - r) * HEAD_DIM + part
    dq = tl.load(Acc + staged, mask=mask)
    for chain in tl.static_range(1, CHAINS):
        dq += tl.load(Acc + chain * _chain_stride(ROWS, HEAD_DIM) + staged, mask=mask)
    tl.store(dQ + offsets, (dq * scale).to(dQ.dtype.element_ty), mask=mask)
