"""FlashAttention-2 kernels: forward, dQ (which also writes D) and dK/dV.

Layout: every tensor is a (B, H, seq, HEAD_DIM) view with unit stride along the head dim
and its own strides for batch, head and sequence (`stride_b`, `stride_h`, `stride_s`), so a
(batch, seq, heads, d) projection viewed as (batch, heads, seq, d) is read and written in
place. The grid's first axis walks the B x H matrices. A head dim that is not a power of two
is padded to BLOCK_D, or, with SPLIT, split into BLOCK_D columns and a tail of BLOCK_T
(80 = 64 + 16: the dots then do 80 columns' work instead of 128's). Every tile then comes
in two parts, each dot over the head dim is two dots into one accumulator, and each
accumulator along the head dim has a tail of its own; without SPLIT the tails are unused
placeholders (the tail descriptors are None) that compile away.

Tiles that a loop walks over come through TMA tensor descriptors (`*_tiles`, 4-D views of
shape (B, H, seq, HEAD_DIM) whose block is one matrix's [1, 1, rows, BLOCK_D], and
`*_tail_tiles`, whose block is [1, 1, rows, BLOCK_T] read from column BLOCK_D): the copy
engine fetches them, and rows past the end of a matrix and pad columns arrive as zeros.
Tiles a program reads once use plain pointer loads.

Scores live in the log2 domain (scale folded into one multiply, exp2 instead
of exp); the saved log-sum-exp L is in natural log, as the PyTorch reference keeps it.

The softmax scale is a compile-time constant (one per head dim): a runtime float would
arrive as fp64 when torch.compile launches the kernels and promote the accumulators.

Each loop over tiles runs in two stages: tiles every row sees whole (no masking at all),
then the few tiles cut by the causal diagonal or by the end of the sequence (masked).
Masked scores become `causal.MASKED_SCORE` (never -inf), so a row never sees
exp(-inf - -inf); which query sees which key is `causal.query_sees_key`'s rule (`sees`).

The three kernels open alike (`program_tile`): a program owns one tile of rows of one
matrix, and the query-tile programs (forward, dQ) run the last tile first.

With fp32 inputs, dK and dV sum their per-query-tile products with Kahan compensation
(`_accumulate_dot`); half-precision inputs accumulate plainly in fp32.

The tile helpers without a leading underscore (`program_tile`, `matrix_base`, `load_rows`,
`store_rows`, `next_tile`, `query_stages`, `query_row_stats`, `sees`) are the building
blocks a variant kernel composes (studies/attention_dq_reduce builds a fused backward
from them); the stages are this file's own.
"""

from __future__ import annotations

import triton
import triton.language as tl

from systems.attention.shared import causal

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
MASKED_SCORE: tl.constexpr = tl.constexpr(causal.MASKED_SCORE)


@triton.jit
def sees(queries, keys):
    """`causal.query_sees_key` on (broadcastable) query and key positions."""
    return queries >= keys


@triton.jit
def _visible(rows, keys, n_k, IS_CAUSAL: tl.constexpr):
    """(rows, keys) bool: the key exists and, under the causal mask, the row's query sees it."""
    keep = keys[None, :] < n_k
    if IS_CAUSAL:
        keep = keep & sees(rows[:, None], keys[None, :])
    return keep


@triton.jit
def program_tile(n_heads, group, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
                 LAST_TILE_FIRST: tl.constexpr, SECTIONS: tl.constexpr):
    """(bh, b, h, start, rows, cols_d) of this program: matrix bh = (batch b, head h), its
    rows [start, start + BLOCK) and the BLOCK_D columns. In launch order programs take
    every matrix's first tile, then every matrix's second, ...; with SECTIONS, a section
    of `group` matrices at a time (`shared.tile_order`). LAST_TILE_FIRST runs the tiles
    in reverse order."""
    n_tiles = tl.num_programs(1)
    if SECTIONS:
        # Compiled only where the matrices split: the index math costs the one-section
        # kernels registers they spill.
        n_bh = tl.num_programs(0)
        launched = tl.program_id(1) * n_bh + tl.program_id(0)
        first = launched // (group * n_tiles) * group  # the section's first matrix
        width = tl.minimum(group, n_bh - first)
        within = launched - first * n_tiles
        bh = first + within % width
        tile = within // width
    else:
        bh = tl.program_id(0)
        tile = tl.program_id(1)
    b = bh // n_heads
    h = bh - b * n_heads
    if LAST_TILE_FIRST:
        tile = n_tiles - 1 - tile
    start = tile * BLOCK
    rows = start + tl.arange(0, BLOCK)
    cols_d = tl.arange(0, BLOCK_D)
    return bh, b, h, start, rows, cols_d


@triton.jit
def matrix_base(base, b, h, stride_b, stride_h):
    """Where matrix (b, h) of a tensor starts."""
    return base + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h


@triton.jit
def load_rows(base, rows, cols, n_rows, stride_s, HEAD_DIM: tl.constexpr):
    """Rows `rows` of a (n_rows, HEAD_DIM) matrix whose rows are stride_s apart;
    out-of-range rows and pad columns read 0."""
    ptrs = base + rows[:, None].to(tl.int64) * stride_s + cols[None, :]
    return tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def store_rows(base, tile, rows, cols, n_rows, stride_s, HEAD_DIM: tl.constexpr):
    ptrs = base + rows[:, None].to(tl.int64) * stride_s + cols[None, :]
    tl.store(ptrs, tile.to(base.dtype.element_ty),
             mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM))


@triton.jit
def next_tile(tiles, b, h, start, col, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Rows [start, start + ROWS) and columns [col, col + COLS) of matrix (b, h) through
    its descriptor, as (ROWS, COLS)."""
    return tiles.load([b, h, start, col]).reshape(ROWS, COLS)


@triton.jit
def _load_tail(base, rows, n_rows, stride_s, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr):
    """The tail columns [BLOCK_D, BLOCK_D + BLOCK_T) of the rows under SPLIT; otherwise a
    placeholder that nothing reads."""
    if SPLIT:
        tail = load_rows(base, rows, BLOCK_D + tl.arange(0, BLOCK_T), n_rows, stride_s,
                          HEAD_DIM)
    else:
        tail = tl.zeros([ROWS, BLOCK_T], dtype=base.dtype.element_ty)
    return tail


@triton.jit
def _store_tail(base, tile, rows, n_rows, stride_s, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr):
    if SPLIT:
        store_rows(base, tile, rows, BLOCK_D + tl.arange(0, BLOCK_T), n_rows, stride_s,
                    HEAD_DIM)


@triton.jit
def _key_stages(q_start, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                IS_CAUSAL: tl.constexpr):
    """For a query tile: keys [0, full_end) need no mask, [full_end, end) need one."""
    full_end = (n_k // BLOCK_N) * BLOCK_N
    end = n_k
    if IS_CAUSAL:
        # A key tile is whole for every row once its last key is <= the tile's first query.
        full_end = tl.minimum(full_end, (q_start + 1) // BLOCK_N * BLOCK_N)
        end = tl.minimum(n_k, q_start + BLOCK_M)
    return full_end, end


@triton.jit
def query_stages(k_start, n_q, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  IS_CAUSAL: tl.constexpr):
    """For a key tile: queries [start, full_start) need the causal mask, [full_start, n_q) not."""
    start = 0
    full_start = 0
    if IS_CAUSAL:
        # Queries before k_start see none of the tile; from k_start + BLOCK_N - 1 on, all of it.
        start = k_start // BLOCK_M * BLOCK_M
        full_start = tl.minimum(tl.cdiv(k_start + BLOCK_N - 1, BLOCK_M) * BLOCK_M, n_q)
    return start, full_start


@triton.jit
def _forward_stage(acc, acc_t, m_i, l_i, q, q_t, k_tiles, v_tiles, k_tail_tiles, v_tail_tiles,
                   b, h, rows, offs_n, n_k, qk_scale, lo, hi, BLOCK_D: tl.constexpr,
                   BLOCK_T: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
                   IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    for k_start in range(lo, hi, BLOCK_N):
        k = next_tile(k_tiles, b, h, k_start, 0, BLOCK_N, BLOCK_D)
        v = next_tile(v_tiles, b, h, k_start, 0, BLOCK_N, BLOCK_D)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if SPLIT:
            k_t = next_tile(k_tail_tiles, b, h, k_start, BLOCK_D, BLOCK_N, BLOCK_T)
            s = tl.dot(q_t, tl.trans(k_t), s, input_precision=DOT_PRECISION)
        if MASKED:
            keep = _visible(rows, k_start + offs_n, n_k, IS_CAUSAL)
            s = tl.where(keep, s * qk_scale, MASKED_SCORE)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            s = s - m_new[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            s = s * qk_scale - m_new[:, None]
        p = tl.exp2(s)
        correction = tl.exp2(m_i - m_new)
        l_i = l_i * correction + tl.sum(p, 1)
        acc = acc * correction[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        if SPLIT:
            v_t = next_tile(v_tail_tiles, b, h, k_start, BLOCK_D, BLOCK_N, BLOCK_T)
            acc_t = acc_t * correction[:, None]
            acc_t = tl.dot(p.to(v_t.dtype), v_t, acc_t, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, acc_t, m_i, l_i


@triton.jit
def flash_forward_kernel(
    Q, stride_qb, stride_qh, stride_qs, k_tiles, v_tiles, k_tail_tiles, v_tail_tiles,
    Out, stride_ob, stride_oh, stride_os, L, n_heads, n_q, n_k, group, SM_SCALE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    SECTIONS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Grid (BH, query tiles). O = softmax(Q K^T * scale) V, L = logsumexp of each row."""
    # Causal query tiles at the end of the sequence do the most work: start them first.
    bh, b, h, q_start, rows, cols_d = program_tile(n_heads, group, BLOCK_M, BLOCK_D, True,
                                                   SECTIONS)
    qk_scale = SM_SCALE * LOG2E
    q_base = matrix_base(Q, b, h, stride_qb, stride_qh)
    q = load_rows(q_base, rows, cols_d, n_q, stride_qs, HEAD_DIM)
    q_t = _load_tail(q_base, rows, n_q, stride_qs, BLOCK_M, HEAD_DIM, BLOCK_D, BLOCK_T, SPLIT)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc_t = tl.zeros([BLOCK_M, BLOCK_T], dtype=tl.float32)

    offs_n = tl.arange(0, BLOCK_N)
    full_end, end = _key_stages(q_start, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    acc, acc_t, m_i, l_i = _forward_stage(
        acc, acc_t, m_i, l_i, q, q_t, k_tiles, v_tiles, k_tail_tiles, v_tail_tiles, b, h, rows,
        offs_n, n_k, qk_scale, 0, full_end, BLOCK_D, BLOCK_T, SPLIT, BLOCK_N, IS_CAUSAL, False,
        DOT_PRECISION)
    acc, acc_t, m_i, l_i = _forward_stage(
        acc, acc_t, m_i, l_i, q, q_t, k_tiles, v_tiles, k_tail_tiles, v_tail_tiles, b, h, rows,
        offs_n, n_k, qk_scale, full_end, end, BLOCK_D, BLOCK_T, SPLIT, BLOCK_N, IS_CAUSAL, True,
        DOT_PRECISION)
    o_base = matrix_base(Out, b, h, stride_ob, stride_oh)
    store_rows(o_base, acc / l_i[:, None], rows, cols_d, n_q, stride_os, HEAD_DIM)
    _store_tail(o_base, acc_t / l_i[:, None], rows, n_q, stride_os, HEAD_DIM, BLOCK_D, BLOCK_T,
                SPLIT)
    tl.store(L + bh.to(tl.int64) * n_q + rows, (m_i + tl.log2(l_i)) * LN2,
             mask=rows < n_q)


@triton.jit
def _dq_stage(dq, dq_t, q, q_t, do, do_t, lse2, delta, k_tiles, v_tiles, k_tail_tiles,
              v_tail_tiles, b, h, rows, offs_n, n_k, qk_scale, lo, hi, BLOCK_D: tl.constexpr,
              BLOCK_T: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
              IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    for k_start in range(lo, hi, BLOCK_N):
        k = next_tile(k_tiles, b, h, k_start, 0, BLOCK_N, BLOCK_D)
        v = next_tile(v_tiles, b, h, k_start, 0, BLOCK_N, BLOCK_D)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        if SPLIT:
            k_t = next_tile(k_tail_tiles, b, h, k_start, BLOCK_D, BLOCK_N, BLOCK_T)
            v_t = next_tile(v_tail_tiles, b, h, k_start, BLOCK_D, BLOCK_N, BLOCK_T)
            s = tl.dot(q_t, tl.trans(k_t), s, input_precision=DOT_PRECISION)
            dp = tl.dot(do_t, tl.trans(v_t), dp, input_precision=DOT_PRECISION)
        p = tl.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            p = tl.where(_visible(rows, k_start + offs_n, n_k, IS_CAUSAL), p, 0.0)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
        if SPLIT:
            dq_t = tl.dot(ds.to(k_t.dtype), k_t, dq_t, input_precision=DOT_PRECISION)
    return dq, dq_t


@triton.jit
def flash_backward_dq_kernel(
    Q, stride_qb, stride_qh, stride_qs, k_tiles, v_tiles, k_tail_tiles, v_tail_tiles,
    Out, stride_ob, stride_oh, stride_os, dO, stride_dob, stride_doh, stride_dos,
    L, Delta, dQ, stride_dqb, stride_dqh, stride_dqs, n_heads, n_q, n_k, SM_SCALE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid (BH, query tiles). dQ = scale * dS K, and Delta = rowsum(O * dO) for dK/dV."""
    # The backward passes keep one section: in sections they lost at d = 64
    # (studies/attention_tile_order).
    bh, b, h, q_start, rows, cols_d = program_tile(n_heads, 0, BLOCK_M, BLOCK_D, True, False)
    qk_scale = SM_SCALE * LOG2E
    q_base = matrix_base(Q, b, h, stride_qb, stride_qh)
    do_base = matrix_base(dO, b, h, stride_dob, stride_doh)
    o_base = matrix_base(Out, b, h, stride_ob, stride_oh)
    q = load_rows(q_base, rows, cols_d, n_q, stride_qs, HEAD_DIM)
    do = load_rows(do_base, rows, cols_d, n_q, stride_dos, HEAD_DIM)
    o = load_rows(o_base, rows, cols_d, n_q, stride_os, HEAD_DIM)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    q_t = _load_tail(q_base, rows, n_q, stride_qs, BLOCK_M, HEAD_DIM, BLOCK_D, BLOCK_T, SPLIT)
    do_t = _load_tail(do_base, rows, n_q, stride_dos, BLOCK_M, HEAD_DIM, BLOCK_D, BLOCK_T, SPLIT)
    if SPLIT:
        o_t = _load_tail(o_base, rows, n_q, stride_os, BLOCK_M, HEAD_DIM, BLOCK_D, BLOCK_T,
                         SPLIT)
        delta += tl.sum(o_t.to(tl.float32) * do_t.to(tl.float32), 1)
    L += bh.to(tl.int64) * n_q
    Delta += bh.to(tl.int64) * n_q
    tl.store(Delta + rows, delta, mask=rows < n_q)
    lse2 = tl.load(L + rows, mask=rows < n_q, other=0.0) * LOG2E
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq_t = tl.zeros([BLOCK_M, BLOCK_T], dtype=tl.float32)

    offs_n = tl.arange(0, BLOCK_N)
    full_end, end = _key_stages(q_start, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dq, dq_t = _dq_stage(dq, dq_t, q, q_t, do, do_t, lse2, delta, k_tiles, v_tiles,
                         k_tail_tiles, v_tail_tiles, b, h, rows, offs_n, n_k, qk_scale, 0,
                         full_end, BLOCK_D, BLOCK_T, SPLIT, BLOCK_N, IS_CAUSAL, False,
                         DOT_PRECISION)
    dq, dq_t = _dq_stage(dq, dq_t, q, q_t, do, do_t, lse2, delta, k_tiles, v_tiles,
                         k_tail_tiles, v_tail_tiles, b, h, rows, offs_n, n_k, qk_scale,
                         full_end, end, BLOCK_D, BLOCK_T, SPLIT, BLOCK_N, IS_CAUSAL, True,
                         DOT_PRECISION)
    dq_base = matrix_base(dQ, b, h, stride_dqb, stride_dqh)
    store_rows(dq_base, dq * SM_SCALE, rows, cols_d, n_q, stride_dqs, HEAD_DIM)
    _store_tail(dq_base, dq_t * SM_SCALE, rows, n_q, stride_dqs, HEAD_DIM, BLOCK_D, BLOCK_T,
                SPLIT)


@triton.jit
def _accumulate_dot(total, carry, a, b, DOT_PRECISION: tl.constexpr):
    """(total + a @ b, carry). fp32 inputs sum with Kahan compensation held in `carry`: dK
    and dV add one product per query tile, and a plain fp32 running sum over 2048 queries
    was 2.5-4.5x PyTorch's error. Half-precision inputs round far above that drift."""
    if a.dtype == tl.float32:
        term = tl.dot(a, b, input_precision=DOT_PRECISION) - carry
        new_total = total + term
        carry = (new_total - total) - term
        total = new_total
    else:
        total = tl.dot(a, b, total, input_precision=DOT_PRECISION)
    return total, carry


@triton.jit
def query_row_stats(L, Delta, rows, n_q, CHECK_ROWS: tl.constexpr):
    """(L in log2 units, D) of a query tile's rows; with CHECK_ROWS, rows past the end read
    L = +inf, which turns their P into 0."""
    if CHECK_ROWS:
        lse2 = tl.load(L + rows, mask=rows < n_q, other=float("inf")) * LOG2E
        delta = tl.load(Delta + rows, mask=rows < n_q, other=0.0)
    else:
        lse2 = tl.load(L + rows) * LOG2E
        delta = tl.load(Delta + rows)
    return lse2, delta


@triton.jit
def _dkdv_stage(dk, dv, dk_carry, dv_carry, dk_t, dv_t, dk_t_carry, dv_t_carry, k, v, k_t, v_t,
                q_tiles, do_tiles, q_tail_tiles, do_tail_tiles, L, Delta, b, h, keys, offs_m,
                n_q, qk_scale, lo, hi, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, CHECK_ROWS: tl.constexpr,
                MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # Tiles are transposed (keys x queries) so dK and dV come out of plain dots. MASKED is
    # the causal diagonal: the end of the sequence is handled by CHECK_ROWS and L = +inf.
    for q_start in range(lo, hi, BLOCK_M):
        rows = q_start + offs_m
        q = next_tile(q_tiles, b, h, q_start, 0, BLOCK_M, BLOCK_D)
        do = next_tile(do_tiles, b, h, q_start, 0, BLOCK_M, BLOCK_D)
        lse2, delta = query_row_stats(L, Delta, rows, n_q, CHECK_ROWS)
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        if SPLIT:
            q_t = next_tile(q_tail_tiles, b, h, q_start, BLOCK_D, BLOCK_M, BLOCK_T)
            do_t = next_tile(do_tail_tiles, b, h, q_start, BLOCK_D, BLOCK_M, BLOCK_T)
            s_t = tl.dot(k_t, tl.trans(q_t), s_t, input_precision=DOT_PRECISION)
        p_t = tl.exp2(s_t * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(sees(rows[None, :], keys[:, None]), p_t, 0.0)
        dv, dv_carry = _accumulate_dot(dv, dv_carry, p_t.to(do.dtype), do, DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        if SPLIT:
            dv_t, dv_t_carry = _accumulate_dot(dv_t, dv_t_carry, p_t.to(do_t.dtype), do_t,
                                               DOT_PRECISION)
            dp_t = tl.dot(v_t, tl.trans(do_t), dp_t, input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk, dk_carry = _accumulate_dot(dk, dk_carry, ds_t.to(q.dtype), q, DOT_PRECISION)
        if SPLIT:
            dk_t, dk_t_carry = _accumulate_dot(dk_t, dk_t_carry, ds_t.to(q_t.dtype), q_t,
                                               DOT_PRECISION)
    return dk, dv, dk_carry, dv_carry, dk_t, dv_t, dk_t_carry, dv_t_carry


@triton.jit
def flash_backward_dkdv_kernel(
    q_tiles, K, stride_kb, stride_kh, stride_ks, V, stride_vb, stride_vh, stride_vs, do_tiles,
    q_tail_tiles, do_tail_tiles, L, Delta, dK, stride_dkb, stride_dkh, stride_dks,
    dV, stride_dvb, stride_dvh, stride_dvs, n_heads, n_q, n_k, SM_SCALE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    CHECK_Q_ROWS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Grid (BH, key tiles). dV = P^T dO and dK = scale * dS^T Q, summed over query tiles."""
    # Causal key tiles at the start of the sequence are seen by the most queries: they are
    # already first in launch order.
    bh, b, h, k_start, keys, cols_d = program_tile(n_heads, 0, BLOCK_N, BLOCK_D, False, False)
    qk_scale = SM_SCALE * LOG2E
    k_base = matrix_base(K, b, h, stride_kb, stride_kh)
    v_base = matrix_base(V, b, h, stride_vb, stride_vh)
    k = load_rows(k_base, keys, cols_d, n_k, stride_ks, HEAD_DIM)
    v = load_rows(v_base, keys, cols_d, n_k, stride_vs, HEAD_DIM)
    k_t = _load_tail(k_base, keys, n_k, stride_ks, BLOCK_N, HEAD_DIM, BLOCK_D, BLOCK_T, SPLIT)
    v_t = _load_tail(v_base, keys, n_k, stride_vs, BLOCK_N, HEAD_DIM, BLOCK_D, BLOCK_T, SPLIT)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dk_carry = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv_carry = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dk_t = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
    dv_t = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
    dk_t_carry = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
    dv_t_carry = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
    L += bh.to(tl.int64) * n_q
    Delta += bh.to(tl.int64) * n_q

    offs_m = tl.arange(0, BLOCK_M)
    start, full_start = query_stages(k_start, n_q, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dk, dv, dk_carry, dv_carry, dk_t, dv_t, dk_t_carry, dv_t_carry = _dkdv_stage(
        dk, dv, dk_carry, dv_carry, dk_t, dv_t, dk_t_carry, dv_t_carry, k, v, k_t, v_t,
        q_tiles, do_tiles, q_tail_tiles, do_tail_tiles, L, Delta, b, h, keys, offs_m, n_q,
        qk_scale, start, full_start, BLOCK_D, BLOCK_T, SPLIT, BLOCK_M, CHECK_Q_ROWS, True,
        DOT_PRECISION)
    dk, dv, dk_carry, dv_carry, dk_t, dv_t, dk_t_carry, dv_t_carry = _dkdv_stage(
        dk, dv, dk_carry, dv_carry, dk_t, dv_t, dk_t_carry, dv_t_carry, k, v, k_t, v_t,
        q_tiles, do_tiles, q_tail_tiles, do_tail_tiles, L, Delta, b, h, keys, offs_m, n_q,
        qk_scale, full_start, n_q, BLOCK_D, BLOCK_T, SPLIT, BLOCK_M, CHECK_Q_ROWS, False,
        DOT_PRECISION)
    dk_base = matrix_base(dK, b, h, stride_dkb, stride_dkh)
    dv_base = matrix_base(dV, b, h, stride_dvb, stride_dvh)
    store_rows(dk_base, dk * SM_SCALE, keys, cols_d, n_k, stride_dks, HEAD_DIM)
    store_rows(dv_base, dv, keys, cols_d, n_k, stride_dvs, HEAD_DIM)
    _store_tail(dk_base, dk_t * SM_SCALE, keys, n_k, stride_dks, HEAD_DIM, BLOCK_D, BLOCK_T,
                SPLIT)
    _store_tail(dv_base, dv_t, keys, n_k, stride_dvs, HEAD_DIM, BLOCK_D, BLOCK_T, SPLIT)
