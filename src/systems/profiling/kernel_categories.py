"""What kind of work a GPU kernel (or CPU op) does, read from its name: one table for every
profile.

`classify_kernel` puts a name in one of seven `CATEGORIES` (the step breakdown's rows);
`kind` coarsens them to matmul / elementwise / other (the kernel summary's columns). GPU
kernel names and CPU aten op names go through the same table: inside a CUDA-graph replay
the launching op is gone and the kernel's name is what is left.
"""

from __future__ import annotations

import re

# (category, pattern) in the order they are tried: the first match wins, so the specific
# names (our Triton attention and optimizer kernels, cross-entropy) come before the broad
# ones (any gemm, any Triton pointwise kernel).
KERNEL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("memory", re.compile(r"^Memcpy|^Memset|memcpy|memset", re.IGNORECASE)),
    ("optimizer", re.compile(r"adam|multi_tensor_apply|_foreach_|Optimizer\.step",
                             re.IGNORECASE)),
    ("attention", re.compile(r"flash|fmha|_attn|attention|sdpa|scaled_dot_product",
                             re.IGNORECASE)),
    ("loss", re.compile(r"cross_entropy|nll_loss|log_?softmax|logsumexp", re.IGNORECASE)),
    ("matmul", re.compile(r"gemm|cutlass|cublas|nvjet|xmma|_mm_|^triton_tem_|"
                          r"^aten::(mm|bmm|addmm|baddbmm|addbmm|_scaled_mm|matmul|linear|"
                          r"dot|mv)$", re.IGNORECASE)),
    ("norm_elementwise", re.compile(r"^triton_(poi|per|red)_|elementwise|reduce_kernel|"
                                    r"norm|CatArray|^aten::(add|sub|mul|div|neg|exp|pow|"
                                    r"rsqrt|sqrt|silu|sigmoid|mean|sum|where|masked_fill|"
                                    r"copy|_to_copy|to|cos|sin|stack|cat|fill|zero|clone|"
                                    r"tril|lerp|addcmul|addcdiv|ones_like|zeros_like)_?$",
                                    re.IGNORECASE)),
)
CATEGORIES = (*(name for name, _ in KERNEL_PATTERNS), "other")

KINDS = ("matmul", "elementwise", "other")
# Optimizer updates and copies stream memory like pointwise kernels; fused attention and
# the loss mix matmuls, reductions and exponentials, so they stay apart from both.
KIND_OF_CATEGORY = {
    "memory": "elementwise", "optimizer": "elementwise", "attention": "other",
    "loss": "other", "matmul": "matmul", "norm_elementwise": "elementwise", "other": "other",
}


def classify_kernel(name: str) -> str:
    """The category of a GPU kernel (or CPU op) called `name`: one of `CATEGORIES`."""
    for category, pattern in KERNEL_PATTERNS:
        if pattern.search(name):
            return category
    return "other"


def kind(kernel: str, op: str = "") -> str:
    """'matmul', 'elementwise' or 'other' for `kernel`, or, where its name says nothing,
    for the op that launched it."""
    category = classify_kernel(kernel)
    if category == "other" and op:
        category = classify_kernel(op)
    return KIND_OF_CATEGORY[category]
