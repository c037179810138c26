"""What several studies share: the backward studies' command line (`run_study`), an fp32
reference for attention gradients, their error measures, do_bench medians, and cuDNN's
attention as the rival row. Studies read the package through its public names and each
other through this module only."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from systems.kernel_runtime.interpreter import INTERPRETED

GRADS = ("dq", "dk", "dv")


def first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else "")[:200]


def reference_grads(inputs: dict[str, torch.Tensor], is_causal: bool) -> list[torch.Tensor]:
    """fp32 (dq, dk, dv): SDPA math on upcast inputs with autograd, one matrix at a time."""
    q = inputs["q"]
    grads = [torch.empty(q.shape, dtype=torch.float32, device=q.device) for _ in GRADS]
    with sdpa_kernel(SDPBackend.MATH):
        for i in range(q.shape[0]):
            q1, k1, v1 = (inputs[name][i][None, None].float().requires_grad_()
                          for name in "qkv")
            out = F.scaled_dot_product_attention(q1, k1, v1, is_causal=is_causal)
            matrix = torch.autograd.grad(out, (q1, k1, v1), inputs["do"][i][None, None].float())
            for whole, part in zip(grads, matrix, strict=True):
                whole[i] = part[0, 0]
    return grads


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def errors(grads: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], label: str
            ) -> dict[str, float]:
    """Max abs difference of each gradient from `expected`'s, keyed <grad>_<label>."""
    return {f"{name}_{label}": max_abs(g, e)
            for name, g, e in zip(GRADS, grads, expected, strict=True)}


def attention_shape(text: str) -> tuple[int, ...]:
    """BxHxSxD as four positive ints: an argparse type for the shapes a study runs."""
    try:
        dims = tuple(int(part) for part in text.split("x"))
    except ValueError:
        dims = ()
    if len(dims) != 4 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"expected BxHxSxD of positive ints, got {text!r}")
    return dims


def bench_ms(fn: Callable[[], object]) -> float:
    return triton.testing.do_bench(fn, return_mode="median")


def _run_header(commit: str, on_gpu: bool = True) -> dict[str, object]:
    """What every study's run record opens with: commit, command line, device, versions."""
    return {"commit": commit, "argv": sys.argv[1:],
            "device": torch.cuda.get_device_name() if on_gpu else "none (built for sm_90)",
            "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if on_gpu else None}


def run_record(commit: str, rounds: int, rows: list[dict[str, object]]) -> dict[str, object]:
    """The JSON record of a study's run: `_run_header`, its rounds and (filled as they
    come) its rows."""
    return {**_run_header(commit), "rounds": rounds, "rows": rows}


def measure_shapes(shapes: Sequence[tuple[int, ...]],
                   measure: Callable[[tuple[int, ...]], dict[str, object]],
                   record: dict[str, object], path: Path,
                   summary: Callable[[dict[str, object]], str]) -> list[dict[str, object]]:
    """`measure`'s row for each shape in turn, appended to `record["rows"]`, the record
    rewritten to `path` after each (a run cut short keeps its rows) and a progress line
    printed (`summary`); returns the rows."""
    rows = record["rows"]
    for number, shape in enumerate(shapes, start=1):
        rows.append(measure(shape))
        path.write_text(json.dumps(record, indent=1))
        print(f"[{number}/{len(shapes)}] {summary(rows[-1])}", flush=True)
        torch.cuda.empty_cache()
    return rows


def graphed(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph, after two calls on a side stream (which plan, compile
    and keep the replay program of our attention calls)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def attempt(row: dict[str, object], work: Callable[[], dict[str, object]]) -> dict[str, object]:
    """row with work()'s fields, or with the error that stopped it."""
    try:
        return row | work()
    except Exception as error:  # recorded per row
        return row | {"error": f"{type(error).__name__}: {first_line(error)}"}


def cudnn_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
              expected: list[torch.Tensor]) -> dict[str, object]:
    """cuDNN's errors against `expected`, how far two of its backward's dQs differ, and its
    forward and backward times, causal, on (batch, 1, seq, d) views; its backward is the
    one its forward picked."""
    batch, seq, head_dim = q.shape
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        qc, kc, vc = (t.view(batch, 1, seq, head_dim).detach().requires_grad_()
                      for t in (q, k, v))
        doc = do.view(batch, 1, seq, head_dim)
        out = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
        grads = torch.autograd.grad(out, (qc, kc, vc), doc, retain_graph=True)
        found: dict[str, object] = errors([g.view(q.shape) for g in grads], expected, "vs_ref")
        # Whether cuDNN's own backward adds dQ in a fixed order: a second call's dQ.
        again = torch.autograd.grad(out, (qc, kc, vc), doc, retain_graph=True)
        found["dq_run_to_run"] = max_abs(grads[0], again[0])
        del grads, again
        found["forward_ms"] = bench_ms(
            lambda: F.scaled_dot_product_attention(qc, kc, vc, is_causal=True))
        found["backward_ms"] = bench_ms(
            lambda: torch.autograd.grad(out, (qc, kc, vc), doc, retain_graph=True))
    found["total_ms"] = found["forward_ms"] + found["backward_ms"]
    return found


Emit = Callable[[dict[str, object]], None]


def run_study(name: str, description: str, head_dims: Sequence[int],
              build_only: Callable[[Emit], None],
              measure: Callable[[int, int, int, Emit], None], seq_multiple: int = 1) -> int:
    """The command line the backward studies share: --build-only calls `build_only`, else
    `measure(batch, seq, head_dim, emit)` per head dim; every row is printed and the whole
    result (versions, device, rows) rewritten to DIR/<name>.json as it comes, so a run cut
    short keeps its rows."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, help=f"write DIR/{name}.json")
    parser.add_argument("--commit", default="unknown", help="recorded in the output")
    parser.add_argument("--build-only", action="store_true",
                        help="build every config for sm_90 (no GPU needed) and report "
                             "shared memory, registers and spills")
    parser.add_argument("--batch", type=int, default=16, help="attention matrices")
    parser.add_argument("--seq-len", type=int, default=16384,
                        help=f"a multiple of {seq_multiple}" if seq_multiple > 1 else None)
    parser.add_argument("--head-dim", type=int, action="append", choices=sorted(head_dims),
                        help="repeatable (default: all)")
    args = parser.parse_args()
    if args.build_only and INTERPRETED:
        parser.error("the kernels are interpreted here: run with TRITON_INTERPRET=0")
    if not args.build_only and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --build-only)")
    if args.seq_len % seq_multiple:
        parser.error(f"--seq-len must be a multiple of {seq_multiple}")
    cuda = not args.build_only
    rows: list[dict[str, object]] = []
    result = {**_run_header(args.commit, on_gpu=cuda), "rows": rows}
    path = args.out / f"{name}.json" if args.out else None
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)

    def emit(row: dict[str, object]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if path:
            path.write_text(json.dumps(result, indent=1))

    if args.build_only:
        build_only(emit)
        return 0
    torch.set_float32_matmul_precision("highest")  # the fp32 reference without TF32
    for head_dim in args.head_dim or list(head_dims):
        measure(args.batch, args.seq_len, head_dim, emit)
        torch.cuda.empty_cache()
    return 0
