"""Host time of eager attention calls, and our kernels against SDPA in one process.

    PYTHONPATH=src python -m studies.attention_host_profile.study --out DIR [--profile-only]

1. Checks ours (eager and compiled) against SDPA at a few shapes (bf16, causal).
2. cProfile of N eager forward+backward calls at 1x1024x64 bf16 causal, host time per call
   grouped by where it goes (launch, descriptors, allocation, checks, autograd), and the
   host enqueue time per call (perf_counter around N calls, one sync at the end).
3. Interleaved eager forward+backward timings, one process: ours (and ours on the Python
   launch path, replay from C++ turned off) vs SDPA flash, cuDNN and SDPA's own choice,
   batch 1, causal, seq 128..65536 (each round times every implementation once, medians
   over rounds; CUDA events around a burst of calls, and the host's time to queue the same
   burst beside it).
4. torch.compile of ours against eager: the bare call and a small model.

Prints a short table last; writes JSON under --out.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from pathlib import Path

import torch

from systems.attention.host_path import replay
from systems.bench.attention import UnsupportedWorkload, attention_function

PROFILE_SHAPE = (1, 1, 1024, 64)
# Ours with replay from C++ off: every call plans and launches in Python.
PYTHON_PATH = "triton_python_path"
# (substring of a profiled function's file or name, group): first match wins.
HOST_GROUPS = (
    ("attention_replay", "replay (C++)"),
    ("flash_triton/replay.py", "replay (C++)"),
    ("tensor_descriptor", "descriptors (build + encode)"),
    ("make_tensordesc", "descriptors (build + encode)"),
    ("fill_tma", "descriptors (build + encode)"),
    ("decompose_descriptor", "descriptors (build + encode)"),
    ("triton_launcher", "kernel launch (Python + driver)"),
    ("triton/runtime", "kernel launch (Python + driver)"),
    ("triton/backends", "kernel launch (Python + driver)"),
    ("method 'run' of", "kernel launch (Python + driver)"),
    ("built-in method launch", "kernel launch (Python + driver)"),
    ("torch.empty", "allocation"),
    ("torch.zeros", "allocation"),
    ("inputs.py", "input checks"),
    ("check_triton_inputs", "input checks"),
    ("_check_signature", "input checks"),
    ("launch.py", "launch planning (launch.py)"),
    ("run_backward", "autograd engine (C++)"),
    ("autograd/function.py", "autograd.Function (Python)"),
    ("function.py", "our Function / op dispatch"),
    ("op.py", "our Function / op dispatch"),
    ("double_backward", "our Function / op dispatch"),
    ("_ops.py", "custom-op dispatch"),
    ("_library", "custom-op dispatch"),
    ("autograd/__init__.py", "autograd.grad (Python)"),
    ("autograd/graph.py", "autograd.grad (Python)"),
)


def _inputs(shape, dtype, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(4))
    return tuple(t.requires_grad_() for t in (q, k, v)), do


def _step(impl, shape, dtype, device):
    attend = attention_function("triton" if impl == PYTHON_PATH else impl, is_causal=True,
                                device=device, dtype=dtype, n_q=shape[-2], n_k=shape[-2])
    inputs, do = _inputs(shape, dtype, device)

    def step():
        return torch.autograd.grad(attend(*inputs), inputs, do)

    if impl != PYTHON_PATH:
        return step

    def python_path_step():
        replay.set_enabled(False)
        try:
            return step()
        finally:
            replay.set_enabled(True)

    return python_path_step


def check_correctness(device) -> list[dict]:
    rows = []
    for shape, dtype in (((2, 4, 1024, 64), torch.bfloat16), ((1, 2, 777, 128), torch.float16),
                         ((1, 1, 300, 80), torch.bfloat16), ((1, 1, 4096, 32), torch.bfloat16)):
        inputs, do = _inputs(shape, dtype, device, seed=1)
        exact = [t.double() for t in inputs]
        ref_o = torch.nn.functional.scaled_dot_product_attention(*exact, is_causal=True)
        ref = (ref_o, *torch.autograd.grad(ref_o, exact, do.double()))
        for impl in ("triton", "triton_compiled", "sdpa_flash"):
            attend = attention_function(impl, is_causal=True, device=device, dtype=dtype,
                                        n_q=shape[-2], n_k=shape[-2])
            o = attend(*inputs)
            got = (o, *torch.autograd.grad(o, inputs, do))
            errors = [((g.double() - r).norm() / r.norm()).item()
                      for g, r in zip(got, ref, strict=True)]
            rows.append({"impl": impl, "shape": shape, "dtype": str(dtype), "rel_errors": errors})
    return rows


def _categorise(stats: pstats.Stats) -> dict[str, float]:
    groups: dict[str, float] = {}
    for (filename, _, name), (_, _, tottime, _, _) in stats.stats.items():
        label = f"{filename}:{name}"
        group = next((g for key, g in HOST_GROUPS if key in label), "other (torch ops, Python)")
        groups[group] = groups.get(group, 0.0) + tottime
    return groups


def host_profile(impl: str, device, calls: int, out: Path) -> dict:
    step = _step(impl, PROFILE_SHAPE, torch.bfloat16, device)
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    enqueue = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        enqueue.append((time.perf_counter() - start) / calls)
        torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    with open(out / f"host_profile_{impl}.txt", "w") as f:
        stats.stream = f
        stats.sort_stats("tottime").print_stats(40)
    groups = {k: v / calls * 1e6 for k, v in _categorise(stats).items()}
    return {"enqueue_us_per_call": statistics.median(enqueue) * 1e6,
            "profiled_us_per_call_by_group": dict(sorted(groups.items(), key=lambda kv: -kv[1]))}


def _burst(step, calls: int) -> tuple[float, float]:
    """Per call, ms: the GPU's span of a burst of back-to-back calls (CUDA events), and the
    host's time to queue them (perf_counter, stopped before waiting for the GPU). Where
    the two are close, the calls are host-bound."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    host_start = time.perf_counter()
    for _ in range(calls):
        step()
    host_s = time.perf_counter() - host_start
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls, host_s * 1e3 / calls


def _burst_ms(step, calls: int) -> float:
    return _burst(step, calls)[0]


def interleaved(device, shapes, impls, rounds: int, rows: list[dict],
                after_shape=lambda: None) -> None:
    """Appends each shape's rows to `rows`, then calls `after_shape` (to save what a run cut
    short by a time limit has measured so far)."""
    for shape, dtype in shapes:
        steps = {}
        for impl in impls:
            try:
                steps[impl] = _step(impl, shape, dtype, device)
                for _ in range(3):
                    steps[impl]()
            except (UnsupportedWorkload, torch.OutOfMemoryError, RuntimeError) as error:
                steps.pop(impl, None)
                rows.append({"shape": shape, "dtype": str(dtype), "impl": impl,
                             "skipped": str(error)[:200]})
        torch.cuda.synchronize()
        # Enough calls per burst for ~20 ms, at least 3.
        calls = {impl: max(3, int(20 / max(_burst_ms(step, 3), 1e-3)))
                 for impl, step in steps.items()}
        times: dict[str, list[float]] = {impl: [] for impl in steps}
        host: dict[str, list[float]] = {impl: [] for impl in steps}
        for _ in range(rounds):
            for impl, step in steps.items():
                device_ms, host_ms = _burst(step, calls[impl])
                times[impl].append(device_ms)
                host[impl].append(host_ms)
        for impl, values in times.items():
            rows.append({"shape": shape, "dtype": str(dtype).removeprefix("torch."),
                         "impl": impl, "median_ms": statistics.median(values),
                         "host_median_ms": statistics.median(host[impl]),
                         "calls_per_burst": calls[impl], "rounds": rounds})
        del steps
        torch.cuda.empty_cache()
        after_shape()


def compiled_model(device, rounds: int) -> list[dict]:
    from systems.model import MODEL_CONFIGS, TransformerLM

    rows = []
    for size, batch, seq in (("tiny", 2, 128), ("small", 4, 512)):
        config = MODEL_CONFIGS[size]
        torch.manual_seed(0)
        model = TransformerLM(config, attention="triton").to(device, torch.bfloat16)
        tokens = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        steps = {}
        for name, module in (("eager", model), ("compiled", torch.compile(model))):
            def step(module=module, tokens=tokens):
                module(tokens).float().square().mean().backward()
            for _ in range(3):
                step()
            steps[name] = step
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                times[name].append(_burst_ms(step, 5))
        for name, values in times.items():
            rows.append({"model": size, "batch": batch, "seq": seq, "mode": name,
                         "median_ms": statistics.median(values)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", default="after")
    parser.add_argument("--commit", default=None, help="the commit whose src ran, recorded")
    parser.add_argument("--profile-only", action="store_true")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    result: dict[str, object] = {"label": args.label, "commit": args.commit,
                                 "gpu": torch.cuda.get_device_name(),
                                 "torch": torch.__version__}
    path = args.out / f"attention_{args.label}.json"

    def save() -> None:  # after every part: a run cut short keeps what it measured
        path.write_text(json.dumps(result, indent=1))

    profiled = (("triton", PYTHON_PATH) if args.profile_only
                else ("triton", PYTHON_PATH, "sdpa_flash", "triton_compiled"))
    result["host_profile"] = {impl: host_profile(impl, device, args.calls, args.out)
                              for impl in profiled}
    save()
    bf16, fp16 = torch.bfloat16, torch.float16
    rivals = ("triton", PYTHON_PATH, "sdpa_flash", "sdpa_cudnn")
    result["timings"] = timings = []
    if args.profile_only:
        interleaved(device, [((1, 1, 1024, 64), bf16)], rivals, args.rounds, timings)
    else:
        result["correctness"] = check_correctness(device)
        save()
        shapes = [((1, 1, s, d), bf16) for d in (64, 128)
                  for s in (128, 512, 1024, 4096, 16384, 65536)]
        shapes += [((1, 1, s, d), bf16) for d in (16, 32) for s in (128, 1024, 16384)]
        shapes += [((1, 1, s, d), fp16) for d in (64, 128) for s in (128, 1024, 16384)]
        shapes += [((16, 1, 16384, 64), bf16), ((16, 1, 16384, 128), bf16)]
        interleaved(device, shapes, (*rivals, "sdpa", "triton_compiled"), args.rounds,
                    timings, save)
        result["compiled_model"] = compiled_model(device, args.rounds)
    save()
    _print_summary(result)


def _print_summary(result: dict) -> None:
    print(f"\n== {result['label']} on {result['gpu']} (torch {result['torch']})")
    for impl, profile in result["host_profile"].items():
        print(f"{impl}: host enqueue per fwd+bwd at 1x1024x64 bf16 causal: "
              f"{profile['enqueue_us_per_call']:.0f} us; cProfile (us/call, inflated by the "
              f"profiler):")
        for group, us in profile["profiled_us_per_call_by_group"].items():
            print(f"  {group:34s} {us:7.1f}")
    for row in result.get("correctness", []):
        print("  check", row["impl"], row["shape"], row["dtype"],
              " ".join(f"{e:.1e}" for e in row["rel_errors"]))
    by_shape: dict[tuple, dict[str, float]] = {}
    for row in result["timings"]:
        if "median_ms" in row:
            by_shape.setdefault((tuple(row["shape"]), row["dtype"]), {})[row["impl"]] = (
                row["median_ms"])
    print("eager fwd+bwd, causal, median ms (ours / flash = ratio)")
    for (shape, dtype), times in by_shape.items():
        ours, flash = times.get("triton"), times.get("sdpa_flash")
        cells = " ".join(f"{impl}={ms:.3f}" for impl, ms in times.items())
        ratio = f"{ours / flash:.2f}" if ours and flash else "-"
        print(f"  {'x'.join(map(str, shape)):14s} {dtype:9s} ours/flash={ratio:5s} {cells}")
    for row in result.get("compiled_model", []):
        print(f"  model {row['model']} b{row['batch']} s{row['seq']} {row['mode']}: "
              f"{row['median_ms']:.3f} ms")


if __name__ == "__main__":
    main()
