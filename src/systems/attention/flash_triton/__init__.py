"""FlashAttention-2 forward and backward kernels in Triton.

Without a CUDA build of PyTorch the kernels run in Triton's interpreter: TRITON_INTERPRET
must be set before they are decorated, which is at this import.
"""

import os

import torch

if torch.version.cuda is None and torch.version.hip is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from systems.attention.flash_triton.function import (  # noqa: E402
    FlashAttentionTriton,
    FlashAttentionTritonCompiledBackward,
    recompute_backward,
)
from systems.attention.flash_triton.launch import (  # noqa: E402
    FlashConfig,
    TileConfig,
    default_config,
    flash_backward,
    flash_forward,
)

__all__ = [
    "FlashAttentionTriton", "FlashAttentionTritonCompiledBackward", "FlashConfig",
    "TileConfig", "default_config", "flash_backward", "flash_forward", "recompute_backward",
]
