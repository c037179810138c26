"""`torchrun --nproc-per-node N -m systems dist {allreduce,train} ...`.

The same rank-side benchmarks as tests/perf/test_distributed.py, joined through env://
rendezvous so they run on one node or across nodes; rank 0 prints one JSON line per result
with the max over ranks of each rank's timings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch.distributed as dist

from systems.bench.distributed.allreduce import bandwidths, timed_allreduces
from systems.bench.distributed.train_step import (
    DATA_PARALLEL_OPTIMIZERS,
    DEFAULT_BUCKET_SIZE_MB,
    DEFAULT_PREFETCH,
    DEFAULT_TAIL_BUCKET_MB,
    VARIANTS,
    TrainSpec,
    setup_train,
    train_round,
)
from systems.cli_flags import (
    add_batch_size,
    add_bucket_size_mb,
    add_seq_len,
    add_size,
    add_warmup_steps,
)
from systems.common.cli_help import (
    ArgumentParser,
    HelpFormatter,
    non_negative_int,
    positive_float,
    positive_int,
)
from systems.common.hardware import gpu_count
from systems.distributed.process_group import RendezvousError, init_from_env
from systems.distributed.rank_pool import worker_state


def _max_over_ranks(value: float) -> float:
    gathered = [0.0] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return max(gathered)


def _allreduce(args: argparse.Namespace) -> list[dict]:
    results = []
    for size_mb in args.sizes_mb:
        size = int(size_mb * 10**6)
        timed_allreduces(size, 2)  # warm-up
        times = [_max_over_ranks(t) for t in timed_allreduces(size, args.iterations)]
        seconds = statistics.median(times)
        results.append({"size_bytes": size, "seconds": seconds,
                        **bandwidths(size, seconds, dist.get_world_size())})
    return results


def _train(args: argparse.Namespace) -> list[dict]:
    spec = TrainSpec(args.variant, args.size, args.batch_size, args.seq_len, args.bucket_size_mb,
                     args.optimizer, tail_bucket_mb=args.tail_bucket_mb,
                     early_step=args.early_step, prefetch=args.prefetch,
                     nccl_max_ctas=args.nccl_max_ctas)
    setup_train(spec)
    steps = [train_round() for _ in range(args.warmup + args.steps)][args.warmup:]
    step = statistics.median(_max_over_ranks(s["step_s"]) for s in steps)
    return [{"spec": vars(spec), "step_s": step}]


def _tail_bucket_mb(text: str) -> float:
    """A positive budget in MiB, or 0 for buckets that do not shrink."""
    return 0.0 if text.strip() in ("0", "0.0") else positive_float(text)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="torchrun ... -m systems dist",
                                     description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl on GPUs")
    parser.add_argument("--timeout-s", type=positive_float, default=300.0,
                        help="bounds the rendezvous (all ranks joining) and every collective")
    commands = parser.add_subparsers(dest="command", required=True)
    allreduce = commands.add_parser("allreduce", help="all-reduce of float32 tensors",
                                    formatter_class=HelpFormatter)
    allreduce.add_argument("--sizes-mb", type=positive_float, nargs="+", default=[1, 10, 100, 1000],
                           help="message sizes")
    allreduce.add_argument("--iterations", type=positive_int, default=10, help="timed all-reduces")
    train = commands.add_parser("train", help="data-parallel train steps",
                                formatter_class=HelpFormatter)
    train.add_argument("--variant", choices=VARIANTS, default="bucketed", help="DDP variant")
    add_bucket_size_mb(train, default=DEFAULT_BUCKET_SIZE_MB, retired=("--bucket-mb",))
    add_size(train, default="xl", retired=("--model",))
    add_batch_size(train, default=8, help="sequences per rank", retired=("--batch",))
    add_seq_len(train, default=128, retired=("--context",))
    train.add_argument("--optimizer", choices=[o.value for o in DATA_PARALLEL_OPTIMIZERS],
                       default=DATA_PARALLEL_OPTIMIZERS[0].value, help="optimizer")
    train.add_argument("--tail-bucket-mb", type=_tail_bucket_mb,
                       default=DEFAULT_TAIL_BUCKET_MB,
                       help="bucketed: the last bucket's budget, MiB (0: no shrinking tail)")
    train.add_argument("--early-step", action=argparse.BooleanOptionalAction, default=None,
                       help="bucketed and fsdp: step each bucket's (unit's) parameters as "
                            "soon as its reduction lands (--no-early-step: the step after "
                            "backward); none: each block's as soon as its gradients exist "
                            "(default: on for bucketed with adamw, off otherwise)")
    train.add_argument("--prefetch", type=non_negative_int, default=DEFAULT_PREFETCH,
                       help="fsdp: unit-root calls gathered ahead")
    train.add_argument("--nccl-max-ctas", type=positive_int, default=None,
                       help="bucketed: all-reduce on an NCCL communicator of at most this many "
                            "thread blocks")
    add_warmup_steps(train, warmup=2, steps=5)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.backend == "nccl" and gpu_count() == 0:
        parser.error("--backend nccl needs a CUDA GPU per rank and this machine has none "
                     "(use --backend gloo)")
    try:
        worker_state["device"] = init_from_env(args.backend, timeout_s=args.timeout_s)
    except RendezvousError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    results = _allreduce(args) if args.command == "allreduce" else _train(args)
    if dist.get_rank() == 0:
        for result in results:
            print(json.dumps({"world_size": dist.get_world_size(),
                              "backend": dist.get_backend(), **result}))
    dist.destroy_process_group()
    return 0
