"""FlashAttention-2 forward and backward kernels in Triton.

Without a CUDA build of PyTorch the kernels run in Triton's interpreter (see
`systems.triton_runtime`, imported before the kernels are decorated).
"""

import systems.triton_runtime  # noqa: F401 - sets TRITON_INTERPRET before the kernels exist
from systems.attention.flash_triton.function import (
    FlashAttentionTriton,
    FlashAttentionTritonCompiledBackward,
    FlashAttentionTritonGluonBackward,
    recompute_backward,
)
from systems.attention.flash_triton.launch import (
    FlashConfig,
    TileConfig,
    default_config,
    flash_backward,
    flash_forward,
)

__all__ = [
    "FlashAttentionTriton", "FlashAttentionTritonCompiledBackward",
    "FlashAttentionTritonGluonBackward", "FlashConfig",
    "TileConfig", "default_config", "flash_backward", "flash_forward", "recompute_backward",
]
