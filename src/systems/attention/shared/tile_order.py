"""Which matrices' tiles run together: sections of matrices whose streamed operands stay in
L2, where running every matrix at once would stream them from HBM.

A tile of a causal kernel walks the two seq x d operands of its matrix (K and V for a query
tile, Q and dO for a key tile). With every matrix's longest tile first and matrices fastest,
a matrix's tiles in one wave (a tile per SM) read its rows together, and its tiles of the
next wave read them again a wave later: from L2 only where every matrix's operands fit
there. With fewer than SPREAD_TILES tiles of a matrix per wave and operands of more than
twice the L2 (128 x 2048 x 128 streams 128 MiB of K and V), nearly every read comes from
HBM. The kernels then take their tiles a section of matrices at a time (longest first,
matrices fastest within it), each section's operands a quarter of the L2. Elsewhere one
section holds every matrix, which keeps tiles of one length together: sections mix
lengths in a wave, and cost up to 14% where the L2 was not the limit (H100 runs).
"""

from __future__ import annotations

import math

import torch

from systems.common import hardware

L2_SHARE = 0.25  # of the L2, one section's streamed operands
SPREAD_TILES = 3  # a matrix's tiles per wave from which its rows are read together enough


def section_matrices(n_matrices: int, seq: int, head_dim: int, itemsize: int,
                     device: torch.device) -> int:
    """How many of n_matrices causal matrices (each streaming two seq x head_dim operands)
    one section of the kernels' tile order holds on `device`."""
    return matrices_per_section(n_matrices, 2 * seq * head_dim * itemsize,
                                hardware.l2_bytes(device), hardware.sm_count(device))


def matrices_per_section(n_matrices: int, streamed_bytes: int, l2_bytes: int, sms: int
                         ) -> int:
    """Matrices per section, from 1 to n_matrices: all of them unless their operands
    overflow the L2 and a wave holds few tiles of each; else as many as a quarter of the L2
    holds, evened out so that the last section is not much smaller than the others."""
    if n_matrices * streamed_bytes <= 2 * l2_bytes or SPREAD_TILES * n_matrices <= sms:
        return n_matrices
    fits = max(1, int(L2_SHARE * l2_bytes) // streamed_bytes)
    return math.ceil(n_matrices / math.ceil(n_matrices / fits))
