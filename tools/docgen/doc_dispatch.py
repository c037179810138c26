"""The attention dispatch: the table `FlashAttentionTriton` picks kernels from
(`systems.attention.dispatch.TABLE`)."""

from __future__ import annotations

import torch

from systems.attention import dispatch

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_FORWARDS = {dispatch.TRITON: "Triton", dispatch.GLUON: "Gluon"}
_BACKWARDS = {dispatch.TWO_PASS: "two passes", dispatch.GLUON_ORDERED: "Gluon, dQ in a fixed order",
              dispatch.GLUON_UNORDERED: "Gluon, dQ in arrival order"}


def _pair(name: str) -> str:
    forward, backward = name.split("+")
    return f"{_FORWARDS[forward]} + {_BACKWARDS[backward]}"


def dispatch_table() -> str:
    """Every rule of `dispatch.TABLE`, in the order the dispatch tries them."""
    lines = ["| GPU | dtype | d | seq from | tokens from | forward | backward |",
             "|---|---|---:|---:|---:|---|---|"]
    for rule in dispatch.TABLE:
        major, minor = rule.capability
        dtype = _DTYPES.get(rule.dtype, str(rule.dtype))
        lines.append(f"| sm_{major}{minor} | {dtype} | {rule.head_dim} | {rule.min_seq} | "
                     f"{rule.min_tokens} | {_FORWARDS[rule.kernels.forward]} | "
                     f"{_BACKWARDS[rule.kernels.backward]} |")
    return ("\n".join(lines) + f"\n\nEverything else runs {_pair(dispatch.DEFAULT.name)}. "
            "(Rows of `systems.attention.dispatch.TABLE`.)\n")


