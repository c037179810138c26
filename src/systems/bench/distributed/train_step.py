"""Rank side of the data-parallel train-step benchmarks.

`setup_train(spec)` builds one configuration (the model in its data-parallel wrapper, its
optimizer and this rank's random batch) with the one step builder,
`systems.bench.workloads.build_model_workload`, and keeps it in `worker_state`; each
`train_round()` runs one step, timing its phases; `teardown_train()` frees it. The same
functions serve the pytest perf cases (through a RankPool) and torchrun launches (see
cli.py).
"""

from __future__ import annotations

import functools
import gc
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from systems.bench.timing import StepTimer
from systems.bench.workloads import ModelWorkload, StepOptions, build_model_workload
from systems.distributed.ddp import DDPBucketed, DDPIndividualParameters, FlatDDP, NaiveDDP
from systems.distributed.fsdp import FSDP
from systems.distributed.rank_pool import worker_state
from systems.model import get_config
from systems.optim import OptimizerName
from systems.optim.names import optimizer_name

VARIANTS = ("none", "torch_ddp", "naive", "flat", "individual", "bucketed", "fsdp",
            "torch_fsdp2")
# The optimizers a data-parallel step can build.
DATA_PARALLEL_OPTIMIZERS = (OptimizerName.ADAMW, OptimizerName.SHARDED, OptimizerName.TORCH_ZERO)
# Bucketed DDP's bucket when none is asked for (here and on the command line): the size the
# quick perf profile gates. `None` (one bucket, synchronised after backward) would overlap no
# communication with backward, which is what the bucketed variant is for.
DEFAULT_BUCKET_SIZE_MB = 100.0


@dataclass(frozen=True)
class TrainSpec:
    """One configuration. variant 'none': each rank trains alone (no communication).
    `bucket_size_mb` belongs to the bucketed variant (None there: one bucket); every other
    variant records None, so saved results name a bucket only where one was used."""

    variant: str
    size: str = "xl"
    batch_per_rank: int = 8
    seq_len: int = 128
    bucket_size_mb: float | None = DEFAULT_BUCKET_SIZE_MB
    optimizer: OptimizerName = OptimizerName.ADAMW
    lr: float = 1e-4

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; choose one of {VARIANTS}")
        # frozen: validated and normalised values replace the ones given
        object.__setattr__(self, "optimizer",
                           optimizer_name(self.optimizer, DATA_PARALLEL_OPTIMIZERS))
        if self.variant != "bucketed":
            object.__setattr__(self, "bucket_size_mb", None)


def _wrap(spec: TrainSpec, model: nn.Module, device: torch.device) -> nn.Module:
    if spec.variant == "torch_ddp":
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if spec.variant == "torch_fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.layers:
            fully_shard(block)
        return fully_shard(model)
    wrappers = {"naive": NaiveDDP, "flat": FlatDDP, "individual": DDPIndividualParameters,
                "fsdp": FSDP, "none": lambda m: m}
    if spec.variant == "bucketed":
        return DDPBucketed(model, spec.bucket_size_mb)
    return wrappers[spec.variant](model)


def _memory(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def setup_train(spec: TrainSpec) -> dict[str, Any]:
    """Build the configuration on this rank; returns memory after initialisation."""
    device = worker_state["device"]
    teardown_train()
    workload = build_model_workload(
        get_config(spec.size), batch_size=spec.batch_per_rank, seq_len=spec.seq_len,
        device=device, options=StepOptions(optimizer=spec.optimizer, lr=spec.lr),
        wrap=functools.partial(_wrap, spec, device=device))
    # Every rank starts from the same weights (the seed; the wrappers broadcast rank 0's)
    # and trains on a batch of its own.
    generator = torch.Generator().manual_seed(1 + dist.get_rank())
    tokens = torch.randint(workload.config.vocab_size, (spec.batch_per_rank, spec.seq_len + 1),
                           generator=generator).to(device)
    workload.load_batch(tokens[:, :-1], tokens[:, 1:])
    worker_state["train"] = workload
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    return {"memory_after_init": _memory(device)}


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    inner = getattr(optimizer, "local_optimizer", None) or getattr(optimizer, "optim", None)
    state = (inner or optimizer).state
    # FSDP2 keeps DTensors, whose numel() is global: count the local shard.
    local = [getattr(t, "_local_tensor", t) for s in state.values() for t in s.values()
             if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in local)


def train_round() -> dict[str, Any]:
    """One timed train step: forward+backward, gradient synchronisation, optimizer step."""
    device = worker_state["device"]
    workload: ModelWorkload = worker_state["train"]
    timer = StepTimer(device)
    before_step = None
    for name, phase in workload.phases:
        if name == "optimizer":
            before_step = _memory(device)
        phase()
        timer.mark(name)
    times = timer.intervals()
    return {
        "step_s": times["total"], "sync_s": times["sync"],
        "memory_before_step": before_step, "memory_after_step": _memory(device),
        "peak_memory": (torch.cuda.max_memory_allocated(device)
                        if device.type == "cuda" else None),
        "optimizer_state_bytes": _optimizer_state_bytes(workload.optimizer),
    }


def teardown_train() -> None:
    worker_state.pop("train", None)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
