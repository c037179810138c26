"""Where our Triton kernels run: on the GPU, or in Triton's interpreter on the CPU.

Without a CUDA (or ROCm) build of PyTorch the kernels run in Triton's interpreter.
TRITON_INTERPRET must be set before a kernel is decorated, so every module that defines
kernels imports this module first.
"""

import os

import torch

if torch.version.cuda is None and torch.version.hip is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402

INTERPRETED: bool = bool(triton.knobs.runtime.interpret)
