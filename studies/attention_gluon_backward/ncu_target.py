"""Three forward + backward calls of one attention at one shape, for a profiler to catch
the third backward: the default path ("triton"), the unordered Gluon backward
("unordered", the library's unordered config called directly) or any registered name
("fa4").

    ncu --clock-control none -k regex:gluon_backward_kernel --launch-skip 2 \
        --launch-count 1 --set full -o OUT/ours \
        python -m studies.attention_gluon_backward.ncu_target triton 1x16x16384x128
"""

from __future__ import annotations

import argparse

import torch

from studies.harness import attention_shape
from systems.attention import get_attention
from systems.attention.flash_triton import flash_forward
from systems.attention.gluon.backward import CONFIGS, gluon_backward

CALLS = 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help='"unordered", or an attention name ("triton", "fa4")')
    parser.add_argument("shape", type=attention_shape, help="BxHxSxD")
    args = parser.parse_args()
    torch.manual_seed(0)
    q, k, v, grad_out = (torch.randn(args.shape, device="cuda", dtype=torch.bfloat16)
                         for _ in range(4))
    if args.name == "unordered":
        rows = [t.reshape(-1, *args.shape[-2:]) for t in (q, k, v, grad_out)]
        out, lse = flash_forward(*rows[:3], True)
        for _ in range(CALLS):
            gluon_backward(*rows[:3], out, lse, rows[3], True, deterministic=False,
                           config=CONFIGS[args.shape[-1], False])
    else:
        attend = get_attention(args.name)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        for _ in range(CALLS):
            torch.autograd.grad(attend(q, k, v, is_causal=True), (q, k, v), grad_out)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
