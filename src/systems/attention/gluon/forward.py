"""The causal forward for Hopper in Gluon, warp-specialised as FA3's forward is.

Query tiles of BLOCK_M rows of every matrix, the last tile first (the longest first), each
by one program or, PERSISTENT, a grid of one program per SM walking the tiles in turn:

- a producer warp loads the tile's Q once, then each key tile's K and V by TMA into a ring
  of shared buffers guarded by mbarriers (K and V on barriers of their own, so that S can
  start before V lands), and gives its registers up (setmaxnreg);
- two consumer warpgroups, each a partition of its own owning 64 of the 128 query rows,
  compute S = Q K^T, the online softmax and O += P V with P from registers, and each
  frees a K/V stage on its own. ASYNC overlaps the softmax of key tile j with the P V
  matmul of tile j - 1 on the tensor cores (FA3's intra-warpgroup overlap): S_j is issued,
  then P_{j-1} V_{j-1}, and the softmax runs once S_j is done while the other is in flight.
  PINGPONG has the warpgroups take turns issuing their matmuls (FA3's inter-warpgroup
  schedule, on two named barriers), so that one's softmax runs while the other's
  matmuls hold the tensor cores.

The order runs a section of matrices at a time (`shared.tile_order`), so that many short
matrices do not each stream their K and V from HBM. Persistent, program p of P takes the
tiles p, 2P - 1 - p, 2P + p, ... of that order (each round of P tiles walked the other way
than the one before, so that a program's long and short tiles even out), and the producer
loads the next tile's Q and first K/V tiles while the consumers finish the last one's P V
and store it (FA3's persistent forward).

Key tiles below the query tile's diagonal run unmasked; the BLOCK_M / BLOCK_N tiles the
diagonal cuts are masked (`causal.MASKED_SCORE`, as the Triton forward). O = acc / l is
stored in bf16 and L = ln(sum exp(S * scale)) in fp32, as `flash_forward` writes them.
It takes what the Gluon backward takes (`backward.unsupported_reason`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from systems.attention.gluon.backward import (
    aligned_rows,
    cut_to,
    descriptor_layouts,
    descriptor_signature,
    gluon_head_dim,
    output_buffer,
    padded_to,
    read_in_place,
    register_cap,
    unsupported_reason,
)
from systems.attention.gluon.backward_kernel import LOG2E, mma_layout, named_arrive, named_sync
from systems.attention.host_path import replay
from systems.attention.shared import causal
from systems.attention.shared.tile_order import section_matrices
from systems.common import hardware
from systems.kernel_runtime.launcher import KernelLauncher, TensorSlot
from systems.kernel_runtime.triton_build import build_for_hopper

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)
MASKED_SCORE: gl.constexpr = gl.constexpr(causal.MASKED_SCORE)
WG_ROWS: gl.constexpr = gl.constexpr(64)  # query rows per consumer warpgroup
BLOCK_M = 128  # query rows per program: two consumer warpgroups
HEAD_DIMS = (64, 128)  # the forward's own; others run zero-padded to one of them
# Named barriers of the ping-pong, of both consumer warpgroups (ids 0 and 1 are Triton's):
# warpgroup w waits on TURN + w for its turn at the tensor cores and passes it on TURN + 1 - w.
TURN: gl.constexpr = gl.constexpr(8)
TURN_THREADS: gl.constexpr = gl.constexpr(256)


def forward_head_dim(head_dim: int) -> int | None:
    """The head dim the forward runs `head_dim` at (zero-padded to one of HEAD_DIMS), or
    None."""
    return gluon_head_dim(head_dim, HEAD_DIMS)


@gluon.jit
def _place_in_round(r):
    """This program's place among round r's tiles: its index, every other round backwards."""
    programs = gl.num_programs(0)
    p = gl.program_id(0)
    return gl.where(r % 2 == 0, p, programs - 1 - p)


@gluon.jit
def _tile_count(n_matrices, n_q, BLOCK: gl.constexpr):
    """How many query tiles this program takes: a full round's one each, and one of the
    last, partial round where its walk reaches the tiles there."""
    n_tiles = n_matrices * (n_q // BLOCK)
    rounds = n_tiles // gl.num_programs(0)
    left = n_tiles - rounds * gl.num_programs(0)
    return rounds + gl.where(_place_in_round(rounds) < left, 1, 0)


@gluon.jit
def _tile(t, n_matrices, n_q, group, BLOCK: gl.constexpr):
    """(matrix, first query row) of this program's t-th tile, walked in rounds of a tile
    per program: a section of `group` matrices at a time (`shared.tile_order`), its tiles
    in order of length, longest first and matrices fastest."""
    n_tiles = n_q // BLOCK
    index = t * gl.num_programs(0) + _place_in_round(t)
    first = index // (group * n_tiles) * group  # the section's first matrix
    width = gl.minimum(group, n_matrices - first)
    within = index - first * n_tiles
    return first + within % width, (n_tiles - 1 - within // width) * BLOCK


@gluon.jit
def _ring(count, NUM_STAGES: gl.constexpr):
    """(stage, phase) of the count-th key tile through the ring, counted over every tile
    of the program."""
    return count % NUM_STAGES, (count // NUM_STAGES) & 1


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready,
                    v_ready, kv_empty, n_q, n_matrices, group):
    """Producer: per query tile, its Q once the consumers are done with the last one's,
    then every key tile up to its diagonal."""
    BLOCK: gl.constexpr = q_smem.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    NUM_STAGES: gl.constexpr = k_bufs.type.shape[0]
    loaded = 0  # key tiles through the ring before this query tile
    for t in range(_tile_count(n_matrices, n_q, BLOCK)):
        bh, q_start = _tile(t, n_matrices, n_q, group, BLOCK)
        row0 = bh * n_q
        # Barriers start as if phase 1 completed: the first wait on each passes at once.
        mbarrier.wait(q_empty, (t & 1) ^ 1)
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [row0 + q_start, 0], q_bar, q_smem)
        n_kv = (q_start + BLOCK) // BLOCK_N
        for j in range(n_kv):
            stage, phase = _ring(loaded + j, NUM_STAGES)
            mbarrier.wait(kv_empty.index(stage), phase ^ 1)
            mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [row0 + j * BLOCK_N, 0],
                                            k_ready.index(stage), k_bufs.index(stage))
            mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [row0 + j * BLOCK_N, 0],
                                            v_ready.index(stage), v_bufs.index(stage))
        loaded += n_kv


@gluon.jit
def _softmax(s, m_i, l_i, j, rows, qk_scale, MASKED: gl.constexpr):
    """Key tile j's scores to (P, the new max, the new sum, alpha = exp2(old max - new
    max), by which the accumulator of the tiles before is rescaled); log2 domain."""
    BLOCK_N: gl.constexpr = s.type.shape[1]
    if MASKED:
        keys = j * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s.type.layout))
        s = gl.where(gl.expand_dims(rows, 1) >= gl.expand_dims(keys, 0), s * qk_scale,
                     MASKED_SCORE)
        m_new = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - gl.expand_dims(m_new, 1))
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def _take_turn(WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        named_sync(TURN + WG, TURN_THREADS)


@gluon.jit
def _pass_turn(WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        named_arrive(TURN + 1 - WG, TURN_THREADS)


@gluon.jit
def _pass_last_turn(WG: gl.constexpr, PINGPONG: gl.constexpr, last_tile):
    # The second warpgroup passes no turn after the program's last matmuls: every wait is
    # matched.
    if WG == 0 or not last_tile:
        _pass_turn(WG, PINGPONG)


@gluon.jit
def _step(j, loaded, acc, m_i, l_i, p_op, q_s, k_bufs, v_bufs, k_ready, v_ready, kv_empty,
          rows, qk_scale, MASKED: gl.constexpr, ASYNC: gl.constexpr, WG: gl.constexpr,
          PINGPONG: gl.constexpr):
    """Key tile j of the query tile (`loaded` key tiles through the ring before it): its
    scores and softmax, and P_{j-1} V_{j-1} into the accumulator (rescaled by alpha_j);
    returns P_j as the next step's operand."""
    NUM_STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    s_layout: gl.constexpr = mma_layout(WG_ROWS, BLOCK_N, gl.num_warps())
    o_row: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    stage, phase = _ring(loaded + j, NUM_STAGES)
    prev, prev_phase = _ring(loaded + j - 1, NUM_STAGES)
    mbarrier.wait(k_ready.index(stage), phase)
    mbarrier.wait(v_ready.index(prev), prev_phase)
    _take_turn(WG, PINGPONG)
    zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    s = warpgroup_mma(q_s, k_bufs.index(stage).permute((1, 0)), zero_s, use_acc=False,
                      is_async=ASYNC)
    acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=ASYNC)
    _pass_turn(WG, PINGPONG)
    if ASYNC:  # S_j done; P_{j-1} V_{j-1} may still run beside the softmax
        s = warpgroup_mma_wait(1, deps=(s,))
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, j, rows, qk_scale, MASKED)
    if ASYNC:
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    mbarrier.arrive(kv_empty.index(prev), count=1)  # this warpgroup is done with the stage
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row), 1)
    p_op = gl.convert_layout(p.to(gl.bfloat16), p_op.type.layout)
    return acc, m_i, l_i, p_op


@gluon.jit
def _compute_partition(q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, kv_empty,
                       Out, L, n_q, n_matrices, group, SM_SCALE: gl.constexpr,
                       ASYNC: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Consumer warpgroup WG (rows [64 WG, 64 WG + 64) of each query tile): per query
    tile, every key tile up to the diagonal, then its rows of O and L."""
    BLOCK: gl.constexpr = q_smem.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    q_s = q_smem.slice(WG * WG_ROWS, WG_ROWS, dim=0)
    if PINGPONG and WG == 1:  # the first warpgroup goes first
        named_arrive(TURN, TURN_THREADS)
    tiles = _tile_count(n_matrices, n_q, BLOCK)
    loaded = 0  # key tiles through the ring before this query tile
    for t in range(tiles):
        bh, q_start = _tile(t, n_matrices, n_q, group, BLOCK)
        n_kv = (q_start + BLOCK) // BLOCK_N
        mbarrier.wait(q_bar, t & 1)
        _query_tile(bh, q_start, n_kv, loaded, t + 1 == tiles, q_s, k_bufs, v_bufs, q_empty,
                    k_ready, v_ready, kv_empty, Out, L, n_q, SM_SCALE, ASYNC, WG, PINGPONG)
        loaded += n_kv


@gluon.jit
def _query_tile(bh, q_start, n_kv, loaded, last_tile, q_s, k_bufs, v_bufs, q_empty, k_ready,
                v_ready, kv_empty, Out, L, n_q, SM_SCALE: gl.constexpr, ASYNC: gl.constexpr,
                WG: gl.constexpr, PINGPONG: gl.constexpr):
    """One query tile of warpgroup WG's: its n_kv key tiles, from the ring's `loaded`-th."""
    HEAD_DIM: gl.constexpr = q_s.type.shape[1]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    NUM_STAGES: gl.constexpr = k_bufs.type.shape[0]
    s_layout: gl.constexpr = mma_layout(WG_ROWS, BLOCK_N, gl.num_warps())
    o_layout: gl.constexpr = mma_layout(WG_ROWS, HEAD_DIM, gl.num_warps())
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    qk_scale = SM_SCALE * LOG2E
    rows = q_start + WG * WG_ROWS + gl.arange(0, WG_ROWS, s_row)
    first_masked = n_kv - 2 * WG_ROWS // BLOCK_N  # the diagonal's key tiles

    # Key tile 0 (masked where it is on the diagonal: the rule holds for every tile).
    stage, phase = _ring(loaded, NUM_STAGES)
    mbarrier.wait(k_ready.index(stage), phase)
    _take_turn(WG, PINGPONG)
    zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    s = warpgroup_mma(q_s, k_bufs.index(stage).permute((1, 0)), zero_s, use_acc=False,
                      is_async=True)
    _pass_turn(WG, PINGPONG)
    s = warpgroup_mma_wait(0, deps=(s,))
    m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, s_row)
    p, m_i, l_i, alpha = _softmax(s, m_i, gl.zeros([WG_ROWS], gl.float32, s_row), 0, rows,
                                  qk_scale, True)
    p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    acc = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, o_layout)
    for j in range(1, first_masked):
        acc, m_i, l_i, p_op = _step(j, loaded, acc, m_i, l_i, p_op, q_s, k_bufs, v_bufs,
                                    k_ready, v_ready, kv_empty, rows, qk_scale, False, ASYNC,
                                    WG, PINGPONG)
    for j in range(gl.maximum(first_masked, 1), n_kv):
        acc, m_i, l_i, p_op = _step(j, loaded, acc, m_i, l_i, p_op, q_s, k_bufs, v_bufs,
                                    k_ready, v_ready, kv_empty, rows, qk_scale, True, ASYNC,
                                    WG, PINGPONG)
    mbarrier.arrive(q_empty, count=1)  # every S of the tile is done: the next Q may load
    last, last_phase = _ring(loaded + n_kv - 1, NUM_STAGES)
    mbarrier.wait(v_ready.index(last), last_phase)
    _take_turn(WG, PINGPONG)
    acc = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)
    _pass_last_turn(WG, PINGPONG, last_tile)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(kv_empty.index(last), count=1)

    o_rows = q_start + WG * WG_ROWS + gl.arange(0, WG_ROWS, o_row)
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    matrix = (bh * n_q).to(gl.int64)
    offsets = (matrix + gl.expand_dims(o_rows, 1)) * HEAD_DIM + gl.expand_dims(cols, 0)
    l_o = gl.convert_layout(l_i, o_row)
    gl.store(Out + offsets, (acc / gl.expand_dims(l_o, 1)).to(Out.dtype.element_ty))
    gl.store(L + matrix + rows, (m_i + gl.log2(l_i)) * LN2)


@gluon.jit
def gluon_forward_kernel(q_desc, k_desc, v_desc, Out, L, n_q, n_matrices, group,
                         SM_SCALE: gl.constexpr,
                         NUM_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                         PRODUCER_REGS: gl.constexpr, ASYNC: gl.constexpr,
                         PINGPONG: gl.constexpr):
    """Grid (programs,): one per query tile, or fewer taking several each; causal; rows
    of all n_matrices matrices stacked ((bh * n_q, d) descriptors, n_q a multiple of the
    query and key tiles). Out is (bh * n_q, d) in the inputs' dtype, L (bh * n_q,) fp32.
    The launch runs 4 warps: the first consumer warpgroup; the second and the producer
    are workers."""
    BLOCK: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM],
                                       k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM],
                                       v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q_empty, count=2)  # one arrival per consumer warpgroup
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=2)  # one arrival per consumer warpgroup
    # Gluon's partition arguments are flat tuples (no unpacking).
    gl.warp_specialize([
        (_compute_partition, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready,
                              kv_empty, Out, L, n_q, n_matrices, group, SM_SCALE, ASYNC, 0,
                              PINGPONG)),
        (_compute_partition, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready,
                              kv_empty, Out, L, n_q, n_matrices, group, SM_SCALE, ASYNC, 1,
                              PINGPONG)),
        (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty,
                           k_ready, v_ready, kv_empty, n_q, n_matrices, group)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


@dataclass(frozen=True)
class GluonForwardConfig:
    block_n: int  # keys per tile
    num_stages: int  # depth of the K/V ring
    async_mma: bool  # overlap the softmax with the previous tile's P V
    pingpong: bool  # the warpgroups take turns at the tensor cores (FA3's ping-pong)
    # One program per SM taking query tiles in turn, the next tile's loads under the last
    # one's end; else one program per query tile.
    persistent: bool = False
    consumer_regs: int = 240
    producer_regs: int = 24

    # The launch's cap: 12 warps (two consumer warpgroups, the producer rounded up to a
    # warpgroup) times it fill the SM's registers; setmaxnreg moves the producer's spare.
    max_regs = register_cap(12)


# The fastest config in H100 runs of studies/attention_gluon_forward/study.py at 16 x 16384, at
# the head dims where it beat the Triton forward (its README: "A forward in Gluon"
# and "A persistent forward"); at d = 64 none did, and the Gluon variants run the Triton
# forward there.
CONFIGS: dict[int, GluonForwardConfig] = {
    128: GluonForwardConfig(block_n=128, num_stages=3, async_mma=True, pingpong=True,
                            persistent=True),
}


def descriptor_specs(config: GluonForwardConfig, head_dim: int
                     ) -> dict[str, tuple[str, list[int], object]]:
    """(Triton dtype, block shape, shared layout) of each descriptor parameter; the launch's
    descriptors and the sm_90 build check's signature both come from here."""
    blocks = {"q_desc": [BLOCK_M, head_dim], "k_desc": [config.block_n, head_dim],
              "v_desc": [config.block_n, head_dim]}
    return {arg: ("bf16", block, gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))
            for arg, block in blocks.items()}


def constexprs(head_dim: int, config: GluonForwardConfig, sm_scale: float | None = None
               ) -> dict[str, object]:
    """The kernel's compile-time arguments; `sm_scale` as in `gluon.backward.constexprs`."""
    return {"SM_SCALE": head_dim ** -0.5 if sm_scale is None else sm_scale,
            "NUM_STAGES": config.num_stages,
            "CONSUMER_REGS": config.consumer_regs, "PRODUCER_REGS": config.producer_regs,
            "ASYNC": config.async_mma, "PINGPONG": config.pingpong}


def gluon_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                  config: GluonForwardConfig | None = None, poison: bool = False,
                  programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) as `flash_forward` returns them, for what the Gluon backward takes
    (`backward.unsupported_reason`): o contiguous, shaped like q; L (..., seq) fp32,
    natural log. Inputs of any strides (copied to contiguous rows where they are not), and
    of head dims it runs zero-padded (`forward_head_dim`). `config` overrides CONFIGS[padded
    d] (and is needed where it has none); `poison` fills o
    and L with NaN first, so that an element the kernel skips shows. `programs` caps a
    persistent launch's grid (one program per SM otherwise), so that a few tiles can
    give each program several. With none of the three, a layout's calls after the first
    are replayed from C++ (`replay`)."""
    reason = unsupported_reason(q, k, v, is_causal)
    if reason is not None:
        raise ValueError(f"the Gluon forward {reason}")
    head_dim = forward_head_dim(q.shape[-1])
    if config is None and head_dim not in CONFIGS:
        raise ValueError(f"the Gluon forward has a tuned config for head dims "
                         f"{sorted(CONFIGS)}, not {head_dim}: pass one")
    chosen = config or CONFIGS[head_dim]
    if programs is not None and not chosen.persistent:
        raise ValueError("programs caps a persistent launch; this config is not persistent")
    if programs is not None and programs < 1:
        raise ValueError(f"programs must be at least 1, got {programs}")
    return replay.replayed_or_run(
        replay.GLUON_FORWARD, is_causal, [q, k, v],
        lambda: _ForwardPlan.of(q, k, v, chosen, programs, poison),
        replayable=config is None and not poison and programs is None)


@dataclass(frozen=True)
class _ForwardPlan:
    """The forward for inputs of one problem and layout: its launch, and whether it reads
    q, k and v in place (`read_in_place`), where replay can run it."""

    launch: KernelLauncher
    seq: int
    n_matrices: int
    group: int  # matrices per section (`shared.tile_order`)
    d: int
    head_dim: int
    in_place: bool
    poison: bool

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           config: GluonForwardConfig, programs: int | None, poison: bool) -> _ForwardPlan:
        seq, d = q.shape[-2:]
        head_dim = forward_head_dim(d)
        rows = math.prod(q.shape[:-1])
        n_matrices = rows // seq
        tiles = n_matrices * (seq // BLOCK_M)  # one program per query tile
        if config.persistent:
            tiles = min(tiles, programs or hardware.sm_count(q.device))
        launch = _forward_launch(rows, seq, head_dim, d, config, tiles, q.get_device())
        group = section_matrices(n_matrices, seq, head_dim, q.dtype.itemsize, q.device)
        return cls(launch, seq, n_matrices, group, d, head_dim,
                   read_in_place((q, k, v), head_dim), poison)

    def _launch_args(self, q: object, k: object, v: object, o: object, lse: object
                     ) -> tuple[object, ...]:
        """The kernel's arguments, given the tensors it reads and writes (or the
        TensorSlots that stand for them)."""
        return q, k, v, o, lse, self.seq, self.n_matrices, self.group

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        q2, k2, v2 = (aligned_rows(padded_to(t, self.head_dim)) for t in (q, k, v))
        o = output_buffer((*q.shape[:-1], self.head_dim), q.dtype, q.device, self.poison)
        lse = output_buffer(q.shape[:-1], torch.float32, q.device, self.poison)
        self.launch(*self._launch_args(q2, k2, v2, o, lse))
        return cut_to(o, self.d), lse

    def replay_program(self) -> replay.Program | None:
        """This plan for replay (`replay.keep`), where it reads in place: table
        (q, k, v, o, L)."""
        if not self.in_place:
            return None
        return replay.forward_program(
            self.launch.replay_launch(self._launch_args(*map(TensorSlot, range(5)))))


@functools.lru_cache(maxsize=256)
def _forward_launch(rows: int, seq: int, head_dim: int, d: int, config: GluonForwardConfig,
                    programs: int, device_index: int) -> KernelLauncher:
    """The forward's launch for `rows` stacked rows of `seq`-long matrices at the padded
    `head_dim` (the problem's own head dim `d` sets the softmax scale), compiled on its first
    call and launched directly after."""
    specs = descriptor_specs(config, head_dim)
    return KernelLauncher(
        gluon_forward_kernel, (programs,), constexprs(head_dim, config, d ** -0.5),
        num_warps=4, num_stages=1, device_index=device_index, maxnreg=config.max_regs,
        descriptors=descriptor_layouts(specs, dict.fromkeys(specs, (rows, head_dim))),
        descriptor_type=TensorDescriptor)


def build(head_dim: int, config: GluonForwardConfig) -> dict[str, int | list[int]]:
    """The forward kernel built for sm_90 as a launch specialises it, on any machine
    (TRITON_INTERPRET=0): shared bytes per block, registers and stack bytes per thread,
    and the register counts its partitions set (`systems.kernel_runtime.triton_build`)."""
    values = constexprs(head_dim, config)
    signature = {"Out": "*bf16", "L": "*fp32", "n_q": "i32", "n_matrices": "i32",
                 "group": "i32"}
    signature |= {name: "constexpr" for name in values}
    signature |= descriptor_signature(descriptor_specs(config, head_dim))
    return build_for_hopper(gluon_forward_kernel, signature, values, num_warps=4,
                            num_stages=1, maxnreg=config.max_regs)
