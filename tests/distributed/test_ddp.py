"""Data-parallel variants against single-process training on the concatenated batch."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from distributed_cases import ToyModel, make_wrapper, train_and_compare

VARIANTS = [
    ("naive", {}), ("flat", {}), ("individual", {}),
    ("bucketed", {"bucket_size_mb": None}),
]


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


@pytest.mark.parametrize("world_size", [4, 6])
def test_bucketed_at_larger_world_sizes(run_on_ranks, backend, world_size):
    results = run_on_ranks(train_and_compare, "bucketed", "toy", world_size=world_size,
                           options={"bucket_size_mb": 2097 / 2**20}, batch_per_rank=1)
    assert len(results) == world_size


def wrapper_is_freed(variant: str, options: dict) -> bool:
    # Post-accumulate-grad hooks live in C++, out of the garbage collector's sight: a hook
    # that held its wrapper strongly would keep every dropped model alive.
    wrapped = make_wrapper(variant, ToyModel(), **options)
    wrapped(torch.randint(5, (2, 3))).sum().backward()
    wrapped.finish_gradient_synchronization()
    ref = weakref.ref(wrapped)
    del wrapped
    gc.collect()
    return ref() is None


@pytest.mark.parametrize(("variant", "options"),
                         [*VARIANTS, ("fsdp", {})], ids=[*(v for v, _ in VARIANTS), "fsdp"])
def test_dropped_wrapper_is_freed(run_on_ranks, variant, options):
    assert all(run_on_ranks(wrapper_is_freed, variant, options))
