"""Data parallel in rounds taken in turn: every variant of the train step (no communication,
torch DDP, our bucketed DDP with each way of hiding communication, FSDP with each prefetch
depth, torch FSDP2) built, timed and freed in one process group, round after round, and
the all-reduce's bus bandwidth by message size; one JSON file per world size. A variant
that fails on every rank (a build refused, out of memory) is recorded with its error and
the rounds go on.

    torchrun --nproc-per-node N -m studies.dp_scaling.study --out DIR/world{N}.json
        [--size xl --batch-size 8 --seq-len 128 --rounds 2 --warmup 2 --steps 5]
        [--variants none bucketed ...] [--allreduce-sizes-mb 1 4 16 64 256 1024]

Run from the repository root with PYTHONPATH=src. A tiny model on CPU with gloo
(`--backend gloo --size tiny`) checks the plumbing. Each round builds every variant in
turn (the order reversed on odd rounds) and records the median over its timed steps of the
slowest rank's step; ratios to `none` are taken within a round. The file is rewritten after
every variant, so a run cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch.distributed as dist

from systems.bench.distributed.allreduce import bandwidths, timed_allreduces
from systems.bench.distributed.train_step import TrainSpec, setup_train, teardown_train, train_round
from systems.bench.metrics import is_out_of_memory
from systems.common.hardware import machine_description
from systems.distributed.process_group import init_from_env
from systems.distributed.rank_pool import worker_state

# name: TrainSpec options beyond the workload's. `none` first: every ratio is against it.
# Bucketed ones step each bucket as its all-reduce lands (TrainSpec's default) unless they
# say otherwise; FSDP ones step after backward unless they say early_step.
VARIANTS: dict[str, dict[str, object]] = {
    "none": {"variant": "none"},
    "none_early_step": {"variant": "none", "early_step": True},
    "torch_ddp": {"variant": "torch_ddp"},
    "bucketed_no_tail": {"variant": "bucketed", "tail_bucket_mb": 0},
    "bucketed": {"variant": "bucketed"},
    "bucketed_late_step": {"variant": "bucketed", "early_step": False},
    "bucketed_ctas8": {"variant": "bucketed", "nccl_max_ctas": 8},
    "fsdp_prefetch0": {"variant": "fsdp", "prefetch": 0},
    "fsdp": {"variant": "fsdp"},
    "fsdp_early_step": {"variant": "fsdp", "early_step": True},
    "fsdp_prefetch2": {"variant": "fsdp", "prefetch": 2},
    "torch_fsdp2": {"variant": "torch_fsdp2"},
}
NCCL_ONLY = {name for name, options in VARIANTS.items() if "nccl_max_ctas" in options}


def max_over_ranks(value: float) -> float:
    values: list[float] = [0.0] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return max(values)


def allreduce_sweep(sizes_mb: list[float], iterations: int) -> list[dict[str, float]]:
    """Median (over iterations) of the slowest rank's all-reduce time per size, float32."""
    rows = []
    for size_mb in sizes_mb:
        size = int(size_mb * 2**20) // 4 * 4
        timed_allreduces(size, 2)  # warm-up
        times = [max_over_ranks(t) for t in timed_allreduces(size, iterations)]
        seconds = statistics.median(times)
        rows.append({"size_bytes": size, "seconds": seconds,
                     **bandwidths(size, seconds, dist.get_world_size())})
    return rows


def time_variant(spec: TrainSpec, warmup: int, steps: int) -> dict[str, object]:
    """Build, warm up, time and free one variant: median over steps of the slowest rank."""
    try:
        setup_train(spec)
        rounds = [train_round() for _ in range(warmup + steps)][warmup:]
    except Exception as error:  # recorded: a failure every rank meets (a build refused, OOM)
        teardown_train()
        kind = "out of memory" if is_out_of_memory(error) else type(error).__name__
        return {"error": f"{kind}: {str(error)[:200]}"}
    teardown_train()
    step = [max_over_ranks(r["step_s"]) for r in rounds]
    sync = [max_over_ranks(r["sync_s"]) for r in rounds]
    peak = max_over_ranks(float(rounds[-1]["peak_memory"] or 0))
    return {"step_s": statistics.median(step), "sync_s": statistics.median(sync),
            "steps_s": step, "peak_memory_bytes": peak or None}


def summary(rounds: list[dict[str, dict]], tokens_per_step: int) -> dict[str, dict]:
    """Per variant: median step over rounds, tokens/s, and each round's ratio to none."""
    names = [name for name in VARIANTS if any(name in r for r in rounds)]
    result = {}
    for name in names:
        steps = [r[name]["step_s"] for r in rounds if "step_s" in r.get(name, {})]
        if not steps:
            result[name] = {"error": next(r[name]["error"] for r in rounds if name in r)}
            continue
        ratios = [r[name]["step_s"] / r["none"]["step_s"] for r in rounds
                  if "step_s" in r.get(name, {}) and "step_s" in r.get("none", {})]
        step = statistics.median(steps)
        result[name] = {"step_s": step, "tokens_per_s": tokens_per_step / step,
                        "vs_none_per_round": ratios,
                        "sync_s": statistics.median(r[name]["sync_s"] for r in rounds
                                                    if "sync_s" in r.get(name, {}))}
    return result


def print_table(result: dict) -> None:
    world = result["world_size"]
    print(f"\nworld size {world}: median step over rounds (slowest rank), the widest spread of "
          "steps within a round, per-round ratio to none", flush=True)
    for name, row in result["summary"].items():
        if "error" in row:
            print(f"  {name:28s} {row['error'][:80]}")
            continue
        ratios = " ".join(f"{r:.3f}" for r in row["vs_none_per_round"])
        # How steady the variant's steps were: the widest round's slowest over its fastest.
        spread = max(max(r[name]["steps_s"]) / min(r[name]["steps_s"]) - 1
                     for r in result["rounds"] if "steps_s" in r.get(name, {}))
        print(f"  {name:28s} {row['step_s'] * 1e3:8.1f} ms  {row['tokens_per_s']:9.0f} tok/s"
              f"  spread {spread:4.0%}  vs none: {ratios}")
    for row in result["allreduce"]:
        print(f"  all-reduce {row['size_bytes'] / 2**20:7.0f} MiB  {row['seconds'] * 1e3:8.3f} ms"
              f"  busbw {row['busbw_gbps']:7.1f} GB/s")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file (rank 0 writes)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl on GPUs")
    parser.add_argument("--commit", default="unknown", help="recorded in the output")
    parser.add_argument("--size", default="xl")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--bucket-size-mb", type=float, default=1000.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant per round")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--allreduce-sizes-mb", type=float, nargs="*",
                        default=[1, 4, 16, 64, 256, 1024], help="MiB; none: no sweep")
    parser.add_argument("--allreduce-iterations", type=int, default=10)
    parser.add_argument("--time-limit-s", type=float, default=None,
                        help="start no round once this much time has passed")
    args = parser.parse_args(argv)
    started = time.monotonic()
    worker_state["device"] = init_from_env(args.backend, timeout_s=300.0)
    world, rank = dist.get_world_size(), dist.get_rank()
    names = ["none", *(n for n in args.variants if n != "none")]
    if dist.get_backend() != "nccl":
        names = [n for n in names if n not in NCCL_ONLY]
    specs = {name: TrainSpec(size=args.size, batch_per_rank=args.batch_size,
                             seq_len=args.seq_len, bucket_size_mb=args.bucket_size_mb,
                             **VARIANTS[name]) for name in names}
    result: dict[str, object] = {
        "study": "dp_scaling", "commit": args.commit, "machine": machine_description(
            worker_state["device"]), "world_size": world, "backend": dist.get_backend(),
        "config": {"size": args.size, "batch_per_rank": args.batch_size,
                   "seq_len": args.seq_len, "bucket_size_mb": args.bucket_size_mb,
                   "warmup": args.warmup, "steps": args.steps, "precision": "fp32"},
        "variants": {name: {k: v for k, v in vars(spec).items() if v is not None}
                     for name, spec in specs.items()},
        "time": "CUDA-event step time of the slowest rank (host clocks on CPU), median over "
                "a variant's timed steps in a round",
        "allreduce": [], "rounds": [], "summary": {},
    }
    if world > 1 and args.allreduce_sizes_mb:
        result["allreduce"] = allreduce_sweep(args.allreduce_sizes_mb, args.allreduce_iterations)
    tokens_per_step = world * args.batch_size * args.seq_len
    for number in range(args.rounds):
        late = [bool(args.time_limit_s) and time.monotonic() - started > args.time_limit_s]
        dist.broadcast_object_list(late, src=0)  # rank 0's clock decides for every rank
        if late[0]:
            break
        order = names if number % 2 == 0 else [names[0], *reversed(names[1:])]
        result["rounds"].append({})
        for name in order:  # the file is rewritten after each variant
            result["rounds"][-1][name] = time_variant(specs[name], args.warmup, args.steps)
            result["summary"] = summary(result["rounds"], tokens_per_step)
            if rank == 0:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(result, indent=1))
        if rank == 0:
            print(f"round {number + 1} done at {time.monotonic() - started:.0f} s", flush=True)
    if rank == 0:
        print_table(result)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
