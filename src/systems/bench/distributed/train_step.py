"""Rank side of the data-parallel train-step benchmarks.

`setup_train(spec)` builds one configuration (the model in its data-parallel wrapper, its
optimizer and this rank's random batch) with the one step builder,
`systems.model.train_step` (through `systems.bench.workloads.build_model_workload`), and
keeps it in `worker_state`; each `train_round()` runs one step, timing its phases;
`teardown_train()` frees it. The same functions serve the pytest perf cases (through a
RankPool) and torchrun launches (see cli.py).
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from systems.bench.timing import StepTimer
from systems.bench.workloads import ModelWorkload, build_model_workload
from systems.distributed.bucket_steps import BucketSteps
from systems.distributed.ddp import DDPBucketed, DDPIndividualParameters, FlatDDP, NaiveDDP
from systems.distributed.fsdp import FSDP
from systems.distributed.grad_sync import TAIL_BUCKET_BYTES
from systems.distributed.rank_pool import worker_state
from systems.model import get_config
from systems.model.train_step import StepOptions
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
DEFAULT_TAIL_BUCKET_MB = TAIL_BUCKET_BYTES / 2**20
DEFAULT_PREFETCH = 1
# The variants that can step each reduction's parameters as it lands (`BucketSteps`), and
# those that do by default: bucketed, measured faster so; fsdp not measured apart yet.
EARLY_STEP_VARIANTS = ("bucketed", "fsdp")
STEPPED_EARLY = ("bucketed",)


@dataclass(frozen=True)
class TrainSpec:
    """One configuration. variant 'none': each rank trains alone (no communication).

    Options of one variant (every other variant records None, so saved results name an
    option only where it was used): `bucket_size_mb` (bucketed; None: one bucket),
    `tail_bucket_mb` (bucketed: the last bucket's budget, see `DDPBucketed`; 0: no
    shrinking tail), `nccl_max_ctas` (bucketed: all-reduce on an NCCL communicator of at
    most this many thread blocks), `prefetch` (fsdp: calls gathered ahead). `early_step`
    (none, bucketed and fsdp, with the adamw optimizer; False elsewhere): the optimizer step
    of each bucket or FSDP unit as soon as its reduction lands (`BucketSteps`), or with no
    communication of each block as soon as its gradients exist (`OverlappedUpdates`, the
    same overlap without waiting for a network). Bucketed steps early by default (None
    resolves to True for it with adamw, its fastest step measured, and to False otherwise);
    `early_step=False` gives the step after backward."""

    variant: str
    size: str = "xl"
    batch_per_rank: int = 8
    seq_len: int = 128
    bucket_size_mb: float | None = DEFAULT_BUCKET_SIZE_MB
    optimizer: OptimizerName = OptimizerName.ADAMW
    lr: float = 1e-4
    tail_bucket_mb: float | None = DEFAULT_TAIL_BUCKET_MB
    early_step: bool | None = None
    prefetch: int | None = DEFAULT_PREFETCH
    nccl_max_ctas: int | None = None

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; choose one of {VARIANTS}")
        # frozen: validated and normalised values replace the ones given
        object.__setattr__(self, "optimizer",
                           optimizer_name(self.optimizer, DATA_PARALLEL_OPTIMIZERS))
        # Stepping some parameters alone needs our AdamW (`step_parameters`).
        steps_alone = self.optimizer == OptimizerName.ADAMW
        if self.early_step is None:
            object.__setattr__(self, "early_step", self.variant in STEPPED_EARLY and steps_alone)
        if self.early_step and self.variant not in ("none", *EARLY_STEP_VARIANTS):
            raise ValueError(f"early_step is an option of 'none', 'bucketed' and 'fsdp', not "
                             f"of {self.variant!r}")
        if self.early_step and not steps_alone:
            raise ValueError(f"early_step needs optimizer 'adamw', not {self.optimizer.value!r} "
                             "(it cannot step some parameters alone)")
        if self.variant != "bucketed":
            for name in ("bucket_size_mb", "tail_bucket_mb", "nccl_max_ctas"):
                object.__setattr__(self, name, None)
        if self.variant != "fsdp":
            object.__setattr__(self, "prefetch", None)


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
                "none": lambda m: m}
    if spec.variant == "bucketed":
        return DDPBucketed(model, spec.bucket_size_mb, tail_bucket_mb=spec.tail_bucket_mb or None,
                           process_group=_limited_group(spec.nccl_max_ctas))
    if spec.variant == "fsdp":
        return FSDP(model, prefetch=spec.prefetch)
    return wrappers[spec.variant](model)


def _limited_group(max_ctas: int | None) -> dist.ProcessGroup | None:
    """None (the default group), or an NCCL group of every rank whose collectives use at
    most `max_ctas` thread blocks (SMs): made once per limit on each rank."""
    if max_ctas is None:
        return None
    if dist.get_backend() != "nccl":
        raise ValueError("nccl_max_ctas needs the nccl backend")
    key = f"nccl_group_max_ctas_{max_ctas}"
    if key not in worker_state:
        options = dist.ProcessGroupNCCL.Options()
        options.config.max_ctas = max_ctas
        worker_state[key] = dist.new_group(backend="nccl", pg_options=options)
    return worker_state[key]


def _with_bucket_steps(workload: ModelWorkload, steps: BucketSteps) -> ModelWorkload:
    """`workload` whose optimizer phase is `steps.step()` (the buckets stepped during
    backward are left out there)."""
    phases = tuple((name, steps.step if name == "optimizer" else phase)
                   for name, phase in workload.phases)

    def step() -> object:
        return [phase() for _, phase in phases][0]

    return dataclasses.replace(workload, phases=phases, step=step)


def _memory(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def setup_train(spec: TrainSpec) -> dict[str, Any]:
    """Build the configuration on this rank; returns memory after initialisation."""
    device = worker_state["device"]
    teardown_train()
    wrapped: list[nn.Module] = []

    def wrap(model: nn.Module) -> nn.Module:
        wrapped.append(_wrap(spec, model, device))
        return wrapped[-1]

    overlap = spec.early_step and spec.variant == "none"
    workload = build_model_workload(
        get_config(spec.size), batch_size=spec.batch_per_rank, seq_len=spec.seq_len,
        device=device, wrap=wrap,
        options=StepOptions(optimizer=spec.optimizer, lr=spec.lr, overlap_optimizer=overlap))
    if spec.early_step and spec.variant in EARLY_STEP_VARIANTS:
        workload = _with_bucket_steps(workload, BucketSteps(workload.optimizer, wrapped[0]))
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
    # ShardedOptimizer's local part, torch ZeRO's, OverlappedUpdates' optimizer.
    inner = next((getattr(optimizer, name) for name in ("local_optimizer", "optim", "optimizer")
                  if hasattr(optimizer, name)), None)
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
