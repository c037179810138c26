"""`systems check-builds [--arch sm_89]`: build every kernel config the suite can pick for
each GPU target on any machine, GPU or not, and hold each build against the target's limits.

Per target (all of sm_80, sm_86, sm_89, sm_90 and sm_120 without --arch): the attention
kernels at every tile config their dispatch can pick there, per dtype and head dim
(`systems.attention.flash_triton.compile_check`; on sm_90 also the configs the small-GPU
switch makes it pick), the fused AdamW kernel, and on sm_90 the Gluon kernels (sm_90 only).
Exits 1 when any build needs more shared memory or registers per block than its target has.
The builds are this Triton's: check with the version the GPU runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import triton

from systems.attention.flash_triton import compile_check
from systems.attention.gluon import backward as gluon_backward
from systems.attention.gluon import forward as gluon_forward
from systems.common.cli_help import HelpFormatter
from systems.common.hardware import TARGETS, GpuTarget
from systems.kernel_runtime.interpreter import INTERPRETED
from systems.kernel_runtime.triton_build import overflow
from systems.optim import adamw_kernel


def _report(target: GpuTarget, label: str, built: dict, num_warps: int, as_json: bool) -> int:
    """Print one build's line; 1 if it does not fit `target`, else 0."""
    problems = overflow(target, built, num_warps)
    if as_json:
        print(json.dumps({"config": label, "target": target.arch, "kernels": {label: built},
                          "over": problems}), flush=True)
    else:
        print(f"{label}: {built['shared_bytes'] / 1024:.0f} KiB, "
              f"{built.get('registers', '?')} regs" + "".join(f" OVER: {p}" for p in problems),
              flush=True)
    return int(bool(problems))


KERNELS = ("attention", "adamw", "gluon")


def check_target(target: GpuTarget, kernels: tuple[str, ...], head_dims: tuple[int, ...],
                 dtypes: tuple[str, ...], as_json: bool) -> int:
    """The number of builds of these `kernels` (KERNELS) that do not fit `target`."""
    over = 0
    if "attention" in kernels:
        over += compile_check.check(target, head_dims=head_dims, dtypes=dtypes,
                                    as_json=as_json)
    if "adamw" in kernels:
        for label, built in adamw_kernel.build(target).items():
            over += _report(target, f"adamw-{label}", built, adamw_kernel.NUM_WARPS, as_json)
    if "gluon" in kernels and target.capability == (9, 0):
        backwards = {f"d{d}{'-ordered' * ordered}": (d, config)
                     for (d, ordered), config in gluon_backward.CONFIGS.items()}
        backwards |= {f"d{d}-ordered-short": (d, config)
                      for d, config in gluon_backward.SHORT_ORDERED_CONFIGS.items()}
        backwards |= {f"d{d}-ordered-full": (d, config)
                      for d, config in gluon_backward.FULL_ORDERED_CONFIGS.items()}
        backwards |= {f"d{d}-ordered-one-matrix": (d, config)
                      for d, config in gluon_backward.ONE_MATRIX_ORDERED_CONFIGS.items()}
        for label, (d, config) in backwards.items():
            # warp-specialised: its partitions set their registers from the launch's cap
            built = gluon_backward.build(d, config)
            over += _report(target, f"gluon-backward-{label}",
                            {k: v for k, v in built.items() if k != "registers"},
                            gluon_backward.CONSUMER_WARPS, as_json)
        for d, config in gluon_forward.CONFIGS.items():
            built = gluon_forward.build(d, config)
            over += _report(target, f"gluon-forward-d{d}",
                            {k: v for k, v in built.items() if k != "registers"}, 4, as_json)
    return over


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="systems check-builds",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--arch", action="append", choices=sorted(TARGETS),
                        help="a target; repeatable (default: all)")
    parser.add_argument("--kernels", action="append", choices=KERNELS,
                        help="repeatable (default: all; Gluon's are sm_90 only)")
    parser.add_argument("--head-dim", action="append", type=int,
                        choices=compile_check.HEAD_DIMS,
                        help="attention head dims; repeatable (default: all)")
    parser.add_argument("--dtype", action="append", choices=sorted(compile_check.DTYPES),
                        help="attention dtypes; repeatable (default: all)")
    parser.add_argument("--json", action="store_true", help="one JSON object per build")
    args = parser.parse_args(argv)
    if INTERPRETED:
        # Kernels decorated under the interpreter cannot be compiled: build in a process
        # that starts without it.
        env = {**os.environ, "TRITON_INTERPRET": "0"}
        return subprocess.run([sys.executable, "-m", "systems", "check-builds", *argv],
                              env=env).returncode
    over = 0
    for arch in args.arch or list(TARGETS):
        if not args.json:
            print(f"== {arch} (Triton {triton.__version__})", flush=True)
        over += check_target(TARGETS[arch], tuple(args.kernels or KERNELS),
                             tuple(args.head_dim or compile_check.HEAD_DIMS),
                             tuple(args.dtype or compile_check.DTYPES), args.json)
    if not args.json:
        print(f"{over} builds over their target's limits" if over else "every build fits")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
