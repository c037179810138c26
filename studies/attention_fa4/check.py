"""FlashAttention-4 against an fp32 reference at the attention table's long shapes, beside
SDPA cuDNN: the rival is timed only where it computes what it should.

    PYTHONPATH=src python -m studies.attention_fa4.check --shape 1x16x16384x64 ...

Prints, per shape, the largest error of the output and of each gradient for FlashAttention-4
and for SDPA cuDNN; exits 1 where FlashAttention-4's is more than twice cuDNN's plus a few
bf16 ulps of the reference's largest value.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from studies.harness import attention_shape
from systems.attention import get_attention

BF16_ULP = 2.0**-7


def _cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # fp32 inputs


def _outputs(attend: Callable[..., torch.Tensor], inputs: list[torch.Tensor],
             grad_out: torch.Tensor) -> list[torch.Tensor]:
    """o, dq, dk, dv of `attend` on fresh leaves made from `inputs`."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = attend(*leaves)
    out.backward(grad_out)
    return [out.detach().float()] + [leaf.grad.float() for leaf in leaves]


def _errors(got: list[torch.Tensor], want: list[torch.Tensor]) -> list[float]:
    return [(g - w).abs().max().item() for g, w in zip(got, want, strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=attention_shape, action="append", required=True,
                        help="BxHxSxD (repeatable)")
    args = parser.parse_args()
    torch.manual_seed(0)
    fa4 = get_attention("fa4")
    failed = False
    for dims in args.shape:
        q, k, v, grad_out = (torch.randn(dims, device="cuda", dtype=torch.bfloat16)
                             for _ in range(4))
        want = _outputs(_reference, [t.float() for t in (q, k, v)], grad_out.float())
        cudnn = _errors(_outputs(_cudnn, [q, k, v], grad_out), want)
        ours = _errors(_outputs(lambda a, b, c: fa4(a, b, c, is_causal=True), [q, k, v],
                                grad_out), want)
        bounds = [2 * c + 4 * BF16_ULP * w.abs().max().item()
                  for c, w in zip(cudnn, want, strict=True)]
        ok = all(e <= b for e, b in zip(ours, bounds, strict=True))
        failed |= not ok
        print("x".join(map(str, dims)), "o dq dk dv max error: fa4",
              " ".join(f"{e:.2e}" for e in ours), "| cudnn", " ".join(f"{e:.2e}" for e in cudnn),
              "ok" if ok else "WRONG", flush=True)
        del q, k, v, grad_out, want
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
