"""The causal forward for Hopper in Gluon, warp-specialised as FA3's forward is.

One program per (query tile of BLOCK_M rows, matrix), last tile first (the longest first):

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

Key tiles below the query tile's diagonal run unmasked; the BLOCK_M / BLOCK_N tiles the
diagonal cuts are masked (`causal.MASKED_SCORE`, as the Triton forward). O = acc / l is
stored in bf16 and L = ln(sum exp(S * scale)) in fp32, as `flash_forward` writes them.
It takes what the Gluon backward takes (`gluon_launch.unsupported_reason`).
"""

from __future__ import annotations

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

from systems.attention import causal
from systems.attention.flash_triton.gluon_kernels import (
    LOG2E,
    mma_layout,
    named_arrive,
    named_sync,
)
from systems.attention.flash_triton.gluon_launch import (
    aligned_rows,
    descriptor_signature,
    descriptors,
    output_buffer,
    register_cap,
    unsupported_reason,
)
from systems.triton_build import build_for_hopper

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)
MASKED_SCORE: gl.constexpr = gl.constexpr(causal.MASKED_SCORE)
WG_ROWS: gl.constexpr = gl.constexpr(64)  # query rows per consumer warpgroup
BLOCK_M = 128  # query rows per program: two consumer warpgroups
# Named barriers of the ping-pong, of both consumer warpgroups (ids 0 and 1 are Triton's):
# warpgroup w waits on TURN + w for its turn at the tensor cores and passes it on TURN + 1 - w.
TURN: gl.constexpr = gl.constexpr(8)
TURN_THREADS: gl.constexpr = gl.constexpr(256)


@gluon.jit
def _program(BLOCK: gl.constexpr):
    """(matrix, first query row) of this program: matrices vary fastest, last tile first."""
    return gl.program_id(0), (gl.num_programs(1) - 1 - gl.program_id(1)) * BLOCK


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready,
                    kv_empty, n_q):
    """Producer: the query tile once, then every key tile up to its diagonal."""
    BLOCK: gl.constexpr = q_smem.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    NUM_STAGES: gl.constexpr = k_bufs.type.shape[0]
    bh, q_start = _program(BLOCK)
    row0 = bh * n_q
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0 + q_start, 0], q_bar, q_smem)
    for j in range((q_start + BLOCK) // BLOCK_N):
        stage = j % NUM_STAGES
        # Barriers start as if phase 1 completed: the first pass over the ring waits on nothing.
        mbarrier.wait(kv_empty.index(stage), ((j // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row0 + j * BLOCK_N, 0], k_ready.index(stage),
                                        k_bufs.index(stage))
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [row0 + j * BLOCK_N, 0], v_ready.index(stage),
                                        v_bufs.index(stage))


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
def _pass_turn(WG: gl.constexpr, PINGPONG: gl.constexpr, LAST: gl.constexpr):
    # The second warpgroup passes no turn after its last matmuls: every wait is matched.
    if PINGPONG and (WG == 0 or not LAST):
        named_arrive(TURN + 1 - WG, TURN_THREADS)


@gluon.jit
def _step(j, acc, m_i, l_i, p_op, q_s, k_bufs, v_bufs, k_ready, v_ready, kv_empty, rows,
          qk_scale, MASKED: gl.constexpr, ASYNC: gl.constexpr, WG: gl.constexpr,
          PINGPONG: gl.constexpr):
    """Key tile j: its scores and softmax, and P_{j-1} V_{j-1} into the accumulator
    (rescaled by alpha_j); returns P_j as the next step's operand."""
    NUM_STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    s_layout: gl.constexpr = mma_layout(WG_ROWS, BLOCK_N, gl.num_warps())
    o_row: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    stage = j % NUM_STAGES
    prev = (j - 1) % NUM_STAGES
    mbarrier.wait(k_ready.index(stage), (j // NUM_STAGES) & 1)
    mbarrier.wait(v_ready.index(prev), ((j - 1) // NUM_STAGES) & 1)
    _take_turn(WG, PINGPONG)
    zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    s = warpgroup_mma(q_s, k_bufs.index(stage).permute((1, 0)), zero_s, use_acc=False,
                      is_async=ASYNC)
    acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=ASYNC)
    _pass_turn(WG, PINGPONG, False)
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
def _compute_partition(q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, Out, L,
                       n_q, SM_SCALE: gl.constexpr, ASYNC: gl.constexpr, WG: gl.constexpr,
                       PINGPONG: gl.constexpr):
    """Consumer warpgroup WG (rows [64 WG, 64 WG + 64) of the query tile): every key tile
    up to the diagonal, then its rows of O and L."""
    BLOCK: gl.constexpr = q_smem.type.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.type.shape[1]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    NUM_STAGES: gl.constexpr = k_bufs.type.shape[0]
    s_layout: gl.constexpr = mma_layout(WG_ROWS, BLOCK_N, gl.num_warps())
    o_layout: gl.constexpr = mma_layout(WG_ROWS, HEAD_DIM, gl.num_warps())
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    qk_scale = SM_SCALE * LOG2E
    bh, q_start = _program(BLOCK)
    rows = q_start + WG * WG_ROWS + gl.arange(0, WG_ROWS, s_row)
    n_kv = (q_start + BLOCK) // BLOCK_N
    first_masked = n_kv - BLOCK // BLOCK_N
    q_s = q_smem.slice(WG * WG_ROWS, WG_ROWS, dim=0)
    if PINGPONG and WG == 1:  # the first warpgroup goes first
        named_arrive(TURN, TURN_THREADS)

    # Key tile 0 (masked where it is on the diagonal: the rule holds for every tile).
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    _take_turn(WG, PINGPONG)
    zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    s = warpgroup_mma(q_s, k_bufs.index(0).permute((1, 0)), zero_s, use_acc=False,
                      is_async=True)
    _pass_turn(WG, PINGPONG, False)
    s = warpgroup_mma_wait(0, deps=(s,))
    m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, s_row)
    p, m_i, l_i, alpha = _softmax(s, m_i, gl.zeros([WG_ROWS], gl.float32, s_row), 0, rows,
                                  qk_scale, True)
    p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    acc = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, o_layout)
    for j in range(1, first_masked):
        acc, m_i, l_i, p_op = _step(j, acc, m_i, l_i, p_op, q_s, k_bufs, v_bufs, k_ready,
                                    v_ready, kv_empty, rows, qk_scale, False, ASYNC, WG,
                                    PINGPONG)
    for j in range(gl.maximum(first_masked, 1), n_kv):
        acc, m_i, l_i, p_op = _step(j, acc, m_i, l_i, p_op, q_s, k_bufs, v_bufs, k_ready,
                                    v_ready, kv_empty, rows, qk_scale, True, ASYNC, WG,
                                    PINGPONG)
    last = (n_kv - 1) % NUM_STAGES
    mbarrier.wait(v_ready.index(last), ((n_kv - 1) // NUM_STAGES) & 1)
    _take_turn(WG, PINGPONG)
    acc = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)
    _pass_turn(WG, PINGPONG, True)
    acc = warpgroup_mma_wait(0, deps=(acc,))

    o_rows = q_start + WG * WG_ROWS + gl.arange(0, WG_ROWS, o_row)
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    matrix = (bh * n_q).to(gl.int64)
    offsets = (matrix + gl.expand_dims(o_rows, 1)) * HEAD_DIM + gl.expand_dims(cols, 0)
    l_o = gl.convert_layout(l_i, o_row)
    gl.store(Out + offsets, (acc / gl.expand_dims(l_o, 1)).to(Out.dtype.element_ty))
    gl.store(L + matrix + rows, (m_i + gl.log2(l_i)) * LN2)


@gluon.jit
def gluon_forward_kernel(q_desc, k_desc, v_desc, Out, L, n_q, SM_SCALE: gl.constexpr,
                         NUM_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                         PRODUCER_REGS: gl.constexpr, ASYNC: gl.constexpr,
                         PINGPONG: gl.constexpr):
    """Grid (matrices, query tiles); causal; rows of all matrices stacked ((bh * n_q, d)
    descriptors, n_q a multiple of the query and key tiles). Out is (bh * n_q, d) in the
    inputs' dtype, L (bh * n_q,) fp32. The launch runs 4 warps: the first consumer
    warpgroup; the second and the producer are workers."""
    BLOCK: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM],
                                       k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM],
                                       v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=2)  # one arrival per consumer warpgroup
    # Gluon's partition arguments are flat tuples (no unpacking).
    gl.warp_specialize([
        (_compute_partition, (q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, Out,
                              L, n_q, SM_SCALE, ASYNC, 0, PINGPONG)),
        (_compute_partition, (q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, Out,
                              L, n_q, SM_SCALE, ASYNC, 1, PINGPONG)),
        (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready,
                           v_ready, kv_empty, n_q)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


@dataclass(frozen=True)
class GluonForwardConfig:
    block_n: int  # keys per tile
    num_stages: int  # depth of the K/V ring
    async_mma: bool  # overlap the softmax with the previous tile's P V
    pingpong: bool  # the warpgroups take turns at the tensor cores (FA3's ping-pong)
    consumer_regs: int = 240
    producer_regs: int = 24

    # The launch's cap: 12 warps (two consumer warpgroups, the producer rounded up to a
    # warpgroup) times it fill the SM's registers; setmaxnreg moves the producer's spare.
    max_regs = register_cap(12)


# The fastest config in H100 runs of scripts/attention_gluon_forward.py at 16 x 16384, at
# the head dims where it beat the Triton forward (docs/attention.md, "A forward in Gluon");
# at d = 64 none did, and the Gluon variants run the Triton forward there.
CONFIGS: dict[int, GluonForwardConfig] = {
    128: GluonForwardConfig(block_n=128, num_stages=3, async_mma=True, pingpong=True),
}


def descriptor_specs(config: GluonForwardConfig, head_dim: int
                     ) -> dict[str, tuple[str, list[int], object]]:
    """(Triton dtype, block shape, shared layout) of each descriptor parameter; the launch's
    descriptors and the sm_90 build check's signature both come from here."""
    blocks = {"q_desc": [BLOCK_M, head_dim], "k_desc": [config.block_n, head_dim],
              "v_desc": [config.block_n, head_dim]}
    return {arg: ("bf16", block, gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))
            for arg, block in blocks.items()}


def constexprs(head_dim: int, config: GluonForwardConfig) -> dict[str, object]:
    return {"SM_SCALE": head_dim ** -0.5, "NUM_STAGES": config.num_stages,
            "CONSUMER_REGS": config.consumer_regs, "PRODUCER_REGS": config.producer_regs,
            "ASYNC": config.async_mma, "PINGPONG": config.pingpong}


def gluon_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                  config: GluonForwardConfig | None = None, poison: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) as `flash_forward` returns them, for what the Gluon backward takes
    (`gluon_launch.unsupported_reason`): o contiguous, shaped like q; L (..., seq) fp32,
    natural log. Inputs of any strides (copied to contiguous rows where they are not).
    `config` overrides CONFIGS[d] (and is needed where it has none); `poison` fills o
    and L with NaN first, so that an element the kernel skips shows."""
    reason = unsupported_reason(q, k, v, is_causal)
    if reason is not None:
        raise ValueError(f"the Gluon forward {reason}")
    seq, head_dim = q.shape[-2:]
    if config is None and head_dim not in CONFIGS:
        raise ValueError(f"the Gluon forward has a tuned config for head dims "
                         f"{sorted(CONFIGS)}, not {head_dim}: pass one")
    config = config or CONFIGS[head_dim]
    q2, k2, v2 = (aligned_rows(t) for t in (q, k, v))
    o = output_buffer(q.shape, q.dtype, q.device, poison)
    lse = output_buffer(q.shape[:-1], torch.float32, q.device, poison)
    descs = descriptors(descriptor_specs(config, head_dim),
                        {"q_desc": q2, "k_desc": k2, "v_desc": v2})
    gluon_forward_kernel[(q2.shape[0] // seq, seq // BLOCK_M)](
        *descs, o, lse, seq, **constexprs(head_dim, config), num_warps=4,
        maxnreg=config.max_regs)
    return o, lse


def build(head_dim: int, config: GluonForwardConfig) -> dict[str, int | list[int]]:
    """The forward kernel built for sm_90 as a launch specialises it, on any machine
    (TRITON_INTERPRET=0): shared bytes per block, registers and stack bytes per thread,
    and the register counts its partitions set (`systems.triton_build`)."""
    values = constexprs(head_dim, config)
    signature = {"Out": "*bf16", "L": "*fp32", "n_q": "i32"}
    signature |= {name: "constexpr" for name in values}
    signature |= descriptor_signature(descriptor_specs(config, head_dim))
    return build_for_hopper(gluon_forward_kernel, signature, values, num_warps=4,
                            num_stages=1, maxnreg=config.max_regs)
