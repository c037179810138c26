"""Rank side of the data-parallel train-step benchmarks.

`setup_train(spec)` builds one configuration (model, wrapper, optimizer, random batch) and
keeps it in `worker_state`; each `train_round()` runs one timed step; `teardown_train()`
frees it. The same functions serve the pytest perf cases (through a RankPool) and torchrun
launches (see cli.py).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from systems.bench.distributed.step_timer import StepTimer
from systems.distributed.ddp import DDPBucketed, DDPIndividualParameters, FlatDDP, NaiveDDP
from systems.distributed.fsdp import FSDP
from systems.distributed.launch import worker_state
from systems.model import TransformerLM, cross_entropy, get_config
from systems.optim import AdamW, OptimizerName, ShardedOptimizer
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


def _optimizer(spec: TrainSpec, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if spec.optimizer == OptimizerName.SHARDED:
        return ShardedOptimizer(params, AdamW, lr=spec.lr)
    if spec.optimizer == OptimizerName.TORCH_ZERO:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=AdamW, lr=spec.lr)
    return AdamW(params, lr=spec.lr)


def _memory(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def setup_train(spec: TrainSpec) -> dict[str, Any]:
    """Build the configuration on this rank; returns memory after initialisation."""
    device = worker_state["device"]
    teardown_train()
    torch.manual_seed(0)
    config = get_config(spec.size)
    with device:
        model = TransformerLM(config)
    wrapped = _wrap(spec, model, device)
    optimizer = _optimizer(spec, [p for p in wrapped.parameters() if p.requires_grad])
    generator = torch.Generator().manual_seed(1 + dist.get_rank())
    tokens = torch.randint(config.vocab_size, (spec.batch_per_rank, spec.seq_len + 1),
                           generator=generator).to(device)
    worker_state["train"] = (spec, wrapped, optimizer, tokens)
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
    spec, wrapped, optimizer, tokens = worker_state["train"]
    timer = StepTimer(device)
    optimizer.zero_grad(set_to_none=True)
    loss = cross_entropy(wrapped(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    timer.mark("backward")
    if hasattr(wrapped, "finish_gradient_synchronization"):
        wrapped.finish_gradient_synchronization()
    timer.mark("sync")
    before_step = _memory(device)
    optimizer.step()
    timer.mark("optimizer")
    times = timer.intervals()
    return {
        "step_s": times["total"], "sync_s": times["sync"],
        "memory_before_step": before_step, "memory_after_step": _memory(device),
        "peak_memory": (torch.cuda.max_memory_allocated(device)
                        if device.type == "cuda" else None),
        "optimizer_state_bytes": _optimizer_state_bytes(optimizer),
    }


def teardown_train() -> None:
    worker_state.pop("train", None)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
