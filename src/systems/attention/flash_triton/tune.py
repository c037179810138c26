"""`python -m systems.attention.flash_triton.tune`: time each kernel's candidate tile configs.

Times the forward, dQ and dK/dV kernels separately (`triton.testing.do_bench` medians) on
one shape, also reporting the first call's compile time and how far each config's output
lands from the default config's. The winners go into `launch._HALF_CONFIGS`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import triton
import triton.testing

from systems.attention.flash_triton.launch import (
    TileConfig,
    backward_dkdv,
    backward_dq,
    default_config,
    flash_forward,
)
from systems.common.cli_help import ArgumentParser, HelpFormatter, positive_int

# (block_m, block_n, num_warps, num_stages); block_m tiles queries, block_n keys.
CANDIDATES: dict[str, list[tuple[int, int, int, int]]] = {
    "forward": [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4),
                (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3), (64, 128, 4, 3),
                (128, 128, 4, 3), (256, 64, 8, 3), (128, 32, 8, 3), (128, 32, 4, 2),
                (64, 32, 4, 2)],
    "dq": [(128, 64, 8, 3), (128, 64, 4, 3), (128, 32, 4, 3), (128, 32, 8, 3), (64, 64, 4, 3),
           (64, 32, 4, 3), (128, 128, 8, 2), (128, 64, 8, 2), (64, 64, 4, 4), (128, 32, 4, 5),
           (64, 32, 4, 2), (32, 32, 4, 2)],
    "dkdv": [(64, 128, 8, 3), (32, 128, 4, 3), (32, 128, 8, 3), (64, 128, 4, 3), (64, 64, 4, 3),
             (32, 64, 4, 3), (128, 128, 8, 2), (16, 128, 4, 4), (64, 128, 8, 2), (32, 128, 4, 5),
             (32, 64, 4, 2), (32, 32, 4, 2), (16, 64, 4, 2)],
}
# The last entries of each list are small two-stage tiles: fp32's three-TF32 dots need them
# at d = 128, where larger tiles run out of shared memory.
CONFIG_FIELDS = {"forward": "forward", "dq": "backward_dq", "dkdv": "backward_dkdv"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _kernel_runner(kernel: str, inputs: dict[str, torch.Tensor], is_causal: bool
                   ) -> Callable[[TileConfig], torch.Tensor]:
    q, k, v, o, lse, do, delta = (inputs[n] for n in ("q", "k", "v", "o", "lse", "do", "delta"))
    if kernel == "forward":
        defaults = default_config(q.shape[-1], q.dtype)
        return lambda tiles: flash_forward(q, k, v, is_causal, replace(defaults, forward=tiles))[0]
    if kernel == "dq":
        return lambda tiles: backward_dq(q, k, v, o, lse, do, is_causal, tiles)[0]
    return lambda tiles: torch.cat(backward_dkdv(q, k, v, do, lse, delta, is_causal, tiles), -1)


def make_inputs(batch: int, seq: int, head_dim: int, dtype: torch.dtype, is_causal: bool,
                device: str = "cuda") -> dict[str, torch.Tensor]:
    q, k, v, do = (torch.randn(batch, seq, head_dim, dtype=dtype, device=device)
                   for _ in range(4))
    o, lse = flash_forward(q, k, v, is_causal)
    _, delta = backward_dq(q, k, v, o, lse, do, is_causal,
                           default_config(head_dim, dtype).backward_dq)
    return {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do, "delta": delta}


def tune_kernel(kernel: str, inputs: dict[str, torch.Tensor], is_causal: bool
                ) -> list[dict[str, object]]:
    run = _kernel_runner(kernel, inputs, is_causal)
    defaults = default_config(inputs["q"].shape[-1], inputs["q"].dtype)
    expected = run(getattr(defaults, CONFIG_FIELDS[kernel])).float()
    results = []
    for shape in CANDIDATES[kernel]:
        tiles = TileConfig(*shape)
        row: dict[str, object] = {"kernel": kernel, "config": list(shape)}
        try:
            start = time.perf_counter()
            out = run(tiles)
            torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - start
            row["max_abs_diff"] = (out.float() - expected).abs().max().item()
            row["ms"] = triton.testing.do_bench(lambda t=tiles: run(t), return_mode="median")
        except (triton.runtime.errors.OutOfResources, RuntimeError) as error:
            row["error"] = str(error).splitlines()[0][:120]
        results.append(row)
        print(json.dumps(row), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m systems.attention.flash_triton.tune",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--batch-heads", type=positive_int, default=16,
                        help="attention matrices: batch x heads")
    parser.add_argument("--seq-len", type=positive_int, default=16384, help="queries and keys")
    parser.add_argument("--head-dim", type=positive_int, action="append",
                        help="repeatable (default: 64)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--no-causal", action="store_true", help="full attention")
    parser.add_argument("--kernel", action="append", choices=sorted(CANDIDATES),
                        help="repeatable (default: all)")
    parser.add_argument("--json", type=Path, help="write all rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("times kernels on a CUDA GPU and this machine has none")
    is_causal = not args.no_causal
    rows = []
    for head_dim in args.head_dim or [64]:
        torch.manual_seed(0)
        inputs = make_inputs(args.batch_heads, args.seq_len, head_dim, DTYPES[args.dtype],
                             is_causal)
        for kernel in args.kernel or list(CANDIDATES):
            results = tune_kernel(kernel, inputs, is_causal)
            rows += [{**r, "head_dim": head_dim} for r in results]
            timed = [r for r in results if "ms" in r]
            best = min(timed, key=lambda r: r["ms"]) if timed else None
            print(f"d={head_dim} {kernel}: best {best and best['config']} "
                  f"{best and round(best['ms'], 3)} ms", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
