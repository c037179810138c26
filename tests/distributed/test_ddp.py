"""Data-parallel variants against single-process training on the concatenated batch."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
import torch.distributed as dist
from distributed_cases import SEQ, VOCAB, ToyModel, make_wrapper, train_and_compare
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from systems.distributed import DDPBucketed
from systems.distributed.grad_sync import make_buckets
from systems.distributed.rank_pool import worker_state

VARIANTS = [
    ("naive", {}), ("flat", {}), ("individual", {}),
    ("bucketed", {"bucket_size_mb": None}),
]
# DDPBucketed's layouts: several buckets with the tail shrinking from a budget smaller than
# the bucket, and without shrinking.
LAYOUTS = {"tail": {"bucket_size_mb": 6000 / 2**20, "tail_bucket_mb": 1000 / 2**20},
           "no_tail": {"bucket_size_mb": 2097 / 2**20, "tail_bucket_mb": None}}


@pytest.mark.parametrize("model_name", ["toy", "tiny_lm"])
@pytest.mark.parametrize(("variant", "options"), VARIANTS, ids=[v for v, _ in VARIANTS])
def test_matches_single_process(run_on_ranks, backend, variant, options, model_name):
    results = run_on_ranks(train_and_compare, variant, model_name, options=options, steps=3)
    assert all(r["compared"] > 0 for r in results)


# ToyModel's trainable parameters take 8768 bytes; in reverse order the budgets below give
# 1, 2 and 4 buckets (a bucket closes when the next parameter would overflow it).
@pytest.mark.parametrize(("bucket_bytes", "expected"), [(None, 1), (6000, 2), (2097, 4)])
@pytest.mark.parametrize("trial", range(3))  # repeated with fresh seeds to catch races
def test_bucketed_sizes(run_on_ranks, backend, bucket_bytes, expected, trial):
    bucket_mb = None if bucket_bytes is None else bucket_bytes / 2**20
    results = run_on_ranks(train_and_compare, "bucketed", "toy", seed=trial,
                           options={"bucket_size_mb": bucket_mb})
    assert [r["buckets"] for r in results] == [expected] * len(results)


@pytest.mark.parametrize(("variant", "options"), VARIANTS, ids=[v for v, _ in VARIANTS])
def test_bitwise_equal_when_the_math_is_exact(run_on_ranks, backend, variant, options):
    # Exact gradients make the reduction order irrelevant, so fp32 results must agree bit
    # for bit: this catches wrong scaling, double-counted tied weights, stale gradients.
    results = run_on_ranks(train_and_compare, variant, "exact", options=options, steps=1,
                           exact=True)
    assert all(r["compared"] > 0 for r in results)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bucket_layouts_match_single_process(run_on_ranks, backend, layout):
    results = run_on_ranks(train_and_compare, "bucketed", "toy", options=LAYOUTS[layout])
    assert all(r["buckets"] >= 3 for r in results)
    results = run_on_ranks(train_and_compare, "bucketed", "exact", options=LAYOUTS[layout],
                           steps=1, exact=True)
    assert all(r["compared"] > 0 for r in results)


def train_on_own_group(model_name: str) -> dict:
    # A second group of every rank (as an NCCL communicator with fewer thread blocks is).
    group = dist.new_group(backend=dist.get_backend())
    return train_and_compare("bucketed", model_name, steps=2,
                             options={"bucket_size_mb": 2097 / 2**20, "process_group": group})


def test_all_reduces_on_a_group_of_their_own(run_on_ranks, backend):
    assert all(r["compared"] > 0 for r in run_on_ranks(train_on_own_group, "toy"))


@pytest.mark.parametrize("world_size", [4, 6])
def test_bucketed_at_larger_world_sizes(run_on_ranks, backend, world_size):
    results = run_on_ranks(train_and_compare, "bucketed", "toy", world_size=world_size,
                           options={"bucket_size_mb": 2097 / 2**20}, batch_per_rank=1)
    assert len(results) == world_size


class CopyCounter(TorchDispatchMode):
    """Counts the operators that copy tensor data, among all that run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.copies += str(func).startswith(("aten.copy_", "aten.cat", "aten.clone"))
        return func(*args, **(kwargs or {}))


def gradient_copies(set_to_none: bool) -> list[int]:
    """Per step, the copies a DDPBucketed step makes beyond the unwrapped model's step,
    after checking that every gradient is a view of its bucket's buffer."""
    device = worker_state["device"]
    torch.manual_seed(0)
    model = ToyModel().to(device)
    reference = copy.deepcopy(model)
    wrapped = DDPBucketed(model, bucket_size_mb=6000 / 2**20)  # 6 + 2 parameters
    tokens = torch.randint(VOCAB, (2, SEQ), device=device)
    extra = []
    for _ in range(3):
        copies = []
        for net in (reference, wrapped):
            net.zero_grad(set_to_none=set_to_none)
            with CopyCounter() as counter:
                net(tokens).sum().backward()
                if net is wrapped:
                    wrapped.finish_gradient_synchronization()
            copies.append(counter.copies)
        extra.append(copies[1] - copies[0])
        for bucket in wrapped.grad_sync.buckets:
            storage = bucket.buffer.untyped_storage().data_ptr()
            assert len(bucket.params) >= 2
            assert all(p.grad.untyped_storage().data_ptr() == storage
                       for p in bucket.params if p.grad is not None)
        assert model.unused.weight.grad is None and model.down.weight.grad is not None
    return extra


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradients_are_views_of_the_bucket(run_on_ranks, backend, set_to_none):
    # Six parameters get gradients. A fresh gradient (after set_to_none) is copied into its
    # bucket once; one that exists is accumulated in place by autograd: no copy at all.
    # Nothing is ever copied out: the all-reduce ran on the buffer the gradients live in.
    expected = [6, 6, 6] if set_to_none else [6, 0, 0]
    assert run_on_ranks(gradient_copies, set_to_none) == [expected, expected]


def wrapper_is_freed(variant: str, options: dict) -> bool:
    # Post-accumulate-grad hooks live in C++, out of the garbage collector's sight: a hook
    # that held its wrapper (or anything holding the parameters) strongly would keep every
    # dropped model alive.
    wrapped = make_wrapper(variant, ToyModel(), **options)
    wrapped(torch.randint(5, (2, 3))).sum().backward()
    wrapped.finish_gradient_synchronization()
    refs = [weakref.ref(wrapped), *(weakref.ref(p) for p in wrapped.parameters())]
    del wrapped
    gc.collect()
    return all(ref() is None for ref in refs)


@pytest.mark.parametrize(("variant", "options"),
                         [*VARIANTS, ("fsdp", {})], ids=[*(v for v, _ in VARIANTS), "fsdp"])
def test_dropped_wrapper_is_freed(run_on_ranks, variant, options):
    assert all(run_on_ranks(wrapper_is_freed, variant, options))


def test_buckets_shrink_towards_the_end_of_backward():
    mib = 2**20
    params = [nn.Parameter(torch.empty(4 * mib, device="meta")) for _ in range(40)]  # 16 MiB
    buckets = make_buckets(params, 256 * mib)
    assert [p for bucket in buckets for p in bucket] == params[::-1]
    sizes = [sum(p.numel() * p.element_size() for p in bucket) // mib for bucket in buckets]
    # Filled from the end of backward: 64, 128, then 256 MiB budgets; the rest comes first.
    assert sizes == [192, 256, 128, 64]
    assert len(make_buckets(params, None)) == 1
    assert [len(b) for b in make_buckets(params, 8 * mib)] == [1] * 40
    # A smaller tail budget: 16, 32, 64, 128, then 256 MiB; none: every bucket 256 MiB.
    sizes = [sum(p.numel() * p.element_size() for p in bucket) // mib
             for bucket in make_buckets(params, 256 * mib, tail_bytes=16 * mib)]
    assert sizes == [144, 256, 128, 64, 32, 16]
    sizes = [sum(p.numel() * p.element_size() for p in bucket) // mib
             for bucket in make_buckets(params, 256 * mib, tail_bytes=None)]
    assert sizes == [128, 256, 256]
