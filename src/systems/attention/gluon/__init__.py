"""The Hopper (sm_90) wing: FlashAttention forward and backward kernels in Gluon."""

import systems.kernel_runtime.interpreter  # noqa: F401 - sets TRITON_INTERPRET before Triton loads
