"""Where a forward + backward's device time goes, kernel by kernel, for ours and cuDNN.

    PYTHONPATH=src python -m studies.attention_kernel_breakdown.study --out DIR [--commit HASH]

For each head dim (64 and 128 by default) at 16 x 16384, bf16, causal, and each
implementation (ours as the dispatch picks, with the Gluon backward ordered and unordered,
and SDPA's cuDNN backend): the `test_attention` step (`torch.autograd.grad` of
the output against a random dO) warmed up, timed by CUDA events over a few steps, then
profiled for as many with torch.profiler. Every kernel's device time is summed per step
and grouped by name; the events' time beside the kernels' sum shows time outside kernels
(gaps), or how far two windows of the same steps differ. Writes
DIR/attention_kernel_breakdown.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from systems.bench.attention import UnsupportedWorkload, build_attention_workload
from systems.common.formatting import markdown_table, shorten

IMPLEMENTATIONS = ("triton", "triton_gluon_bwd", "triton_gluon_bwd_unordered", "sdpa_cudnn")
WARMUP, STEPS = 3, 20


def _event_ms(step, steps: int) -> float:
    """Mean CUDA-event time of one step over `steps` back-to-back steps, ms."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def breakdown(impl: str, head_dim: int, batch: int, seq: int) -> dict[str, object]:
    """Per-kernel device ms per step of one implementation's forward + backward."""
    workload = build_attention_workload(impl, shape=(batch, 1, seq, head_dim),
                                        dtype=torch.bfloat16, mode="forward_backward",
                                        is_causal=True, device=torch.device("cuda"))
    for _ in range(WARMUP):
        workload.step()
    torch.cuda.synchronize()
    event_ms = _event_ms(workload.step, STEPS)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            workload.step()
        torch.cuda.synchronize()
    # The device's own events, by name: kernels launched from C++ (our replayed forward)
    # belong to no CPU op, so attributing kernels through their launching op would miss them.
    by_kernel = {e.key: e.device_time_total / 1e3 / STEPS for e in prof.key_averages()
                 if str(e.device_type).endswith("CUDA")}
    return {"implementation": impl, "head_dim": head_dim, "batch": batch, "seq": seq,
            "event_ms_per_step": event_ms, "kernel_ms_per_step": sum(by_kernel.values()),
            "kernels": dict(sorted(by_kernel.items(), key=lambda item: -item[1]))}


def markdown(rows: list[dict[str, object]], header: str) -> str:
    parts = [f"# Attention forward + backward, kernel by kernel\n\n{header}\n"]
    parts.append(markdown_table(
        ["d", "implementation", "CUDA events ms / step", "kernels ms / step"],
        [[r["head_dim"], r["implementation"], f"{r['event_ms_per_step']:.3f}",
          f"{r['kernel_ms_per_step']:.3f}"] for r in rows if "kernels" in r]))
    for r in rows:
        if "kernels" not in r:
            parts.append(f"\nd = {r['head_dim']}, {r['implementation']}: {r['error']}")
            continue
        parts.append(f"\n## d = {r['head_dim']}, {r['implementation']}\n")
        parts.append(markdown_table(["kernel", "ms / step"],
                                    [[shorten(name, 100), f"{ms:.3f}"]
                                     for name, ms in r["kernels"].items()]))
    return "\n".join(parts) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--commit", default="unknown", help="recorded in the output")
    parser.add_argument("--batch", type=int, default=16, help="attention matrices")
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--head-dim", type=int, action="append", choices=(64, 128),
                        help="repeatable (default: 64 and 128)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    header = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton "
              f"{triton.__version__}, cuDNN {torch.backends.cudnn.version()}; commit "
              f"{args.commit}; {args.batch} x {args.seq_len}, bf16, causal; {STEPS} profiled "
              f"steps after {WARMUP} warm-up steps, times per step.")
    rows: list[dict[str, object]] = []
    for head_dim in args.head_dim or (64, 128):
        for impl in IMPLEMENTATIONS:
            try:
                row = breakdown(impl, head_dim, args.batch, args.seq_len)
            except UnsupportedWorkload as reason:
                row = {"implementation": impl, "head_dim": head_dim, "error": str(reason)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
            torch.cuda.empty_cache()
    result = {"commit": args.commit, "argv": sys.argv[1:], "header": header, "rows": rows}
    (args.out / "attention_kernel_breakdown.json").write_text(json.dumps(result, indent=1))
    (args.out / "attention_kernel_breakdown.md").write_text(markdown(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
