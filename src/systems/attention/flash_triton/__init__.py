"""FlashAttention-2 forward and backward kernels in Triton, and their launches.

The autograd Functions that call them are `systems.attention.functions`.

Without a CUDA build of PyTorch the kernels run in Triton's interpreter (see
`systems.kernel_runtime.interpreter`, imported before the kernels are decorated).
"""

import systems.kernel_runtime.interpreter  # noqa: F401 - sets TRITON_INTERPRET before the kernels exist
from systems.attention.flash_triton.launch import (
    FlashConfig,
    TileConfig,
    default_config,
    flash_backward,
    flash_forward,
)

__all__ = ["FlashConfig", "TileConfig", "default_config", "flash_backward", "flash_forward"]
