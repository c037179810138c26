"""Which matrices' query tiles the causal forwards run together: sections of matrices
whose K and V stay in L2, where running every matrix at once would stream them from HBM.

A query tile walks the K and V of its matrix. With every matrix's longest tile first and
matrices fastest, a matrix's tiles in one wave (a tile per SM) read its rows together, and
its tiles of the next wave read them again a wave later: from L2 only where every
matrix's K and V fit there. With fewer than SPREAD_TILES tiles of a matrix per wave and K
and V of more than twice the L2 (128 x 2048 x 128 streams 128 MiB), nearly every read
comes from HBM. The forwards (Triton and Gluon) then take their tiles a section of
matrices at a time (longest first, matrices fastest within it), each section's K and V a
quarter of the L2. Elsewhere one section holds every matrix: sections mix tile lengths in
a wave, which cost time where the L2 was not the limit. The backward passes keep one
section (studies/attention_tile_order).
"""

from __future__ import annotations

import math

import torch

from systems.common import hardware

L2_SHARE = 0.25  # of the L2, one section's K and V
SPREAD_TILES = 3  # a matrix's tiles per wave from which its rows are read together enough


def section_matrices(n_matrices: int, seq: int, head_dim: int, itemsize: int,
                     device: torch.device) -> int:
    """How many of n_matrices causal matrices (K and V each seq x head_dim) one section of
    the forwards' tile order holds on `device`."""
    return matrices_per_section(n_matrices, 2 * seq * head_dim * itemsize,
                                hardware.l2_bytes(device), hardware.sm_count(device))


def matrices_per_section(n_matrices: int, streamed_bytes: int, l2_bytes: int, sms: int
                         ) -> int:
    """Matrices per section, from 1 to n_matrices: all of them unless their K and V
    overflow the L2 and a wave holds few tiles of each; else as many as a quarter of the L2
    holds, evened out so that the last section is not much smaller than the others."""
    if n_matrices * streamed_bytes <= 2 * l2_bytes or SPREAD_TILES * n_matrices <= sms:
        return n_matrices
    fits = max(1, int(L2_SHARE * l2_bytes) // streamed_bytes)
    return math.ceil(n_matrices / math.ceil(n_matrices / fits))
