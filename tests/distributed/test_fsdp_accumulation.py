"""FSDP's no_sync() against single-process training, and ranks that run different FSDP
collectives (a branch taken on some ranks only)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from distributed_cases import SEQ, VOCAB, BranchToyModel, ExactStackModel, train_and_compare

from systems.distributed import FSDP
from systems.distributed import fsdp as fsdp_module
from systems.distributed.rank_pool import worker_state
from systems.model import cross_entropy


@pytest.mark.parametrize("sync_last", [True, False], ids=["last_outside", "all_inside"])
@pytest.mark.parametrize("model_name", ["exact", "exact_stack"])
def test_no_sync_bitwise_equal_when_the_math_is_exact(run_on_ranks, backend, model_name,
                                                      sync_last):
    # Two microbatches per rank, the first (or both) inside no_sync(): AdamW on the summed
    # gradients must give the single-process parameters bit for bit.
    results = run_on_ranks(train_and_compare, "fsdp", model_name, steps=1, exact=True,
                           microbatches=2, sync_last=sync_last)
    assert all(r["compared"] > 0 for r in results)


def test_no_sync_matches_single_process(run_on_ranks, backend):
    # ToyModel: random data, cross-entropy, a norm, a layer no rank uses; fp32 tolerance.
    results = run_on_ranks(train_and_compare, "fsdp", "toy", steps=3, batch_per_rank=4,
                           microbatches=4)
    assert all(r["compared"] > 0 for r in results)


def reduce_scatters_per_backward() -> list[int]:
    """Reduce-scatters launched by each of three backwards (two inside no_sync(), one
    outside) and by the sync after them."""
    device = worker_state["device"]
    wrapped = FSDP(ExactStackModel().to(device))
    tokens = torch.randint(16, (2, SEQ), device=device)
    scatter, counts = fsdp_module.reduce_scatter_flat, [0]

    def counting_scatter(*args, **kwargs):
        counts[-1] += 1
        return scatter(*args, **kwargs)

    fsdp_module.reduce_scatter_flat = counting_scatter
    try:
        for inside in (True, True, False):
            with wrapped.no_sync() if inside else torch.enable_grad():
                wrapped(tokens).sum().backward()
            counts.append(0)
        wrapped.finish_gradient_synchronization()
    finally:
        fsdp_module.reduce_scatter_flat = scatter
    return counts


def test_no_sync_reduces_nothing_until_a_backward_outside(run_on_ranks):
    # Nothing inside no_sync(); in the backward after it, one per gather of a trainable
    # unit: the two blocks, and the embedding's unit twice (the tied head, called outside
    # the embedding, gathers it again). The frozen layer has no gradient. A reduce-scatter
    # waits for the next collective to share its check: the embedding unit's two, after
    # the backward's last gather, are launched by the sync.
    assert run_on_ranks(reduce_scatters_per_backward) == [[0, 0, 2, 2]] * 2


def error_of_a_step(wrapped: FSDP, branch: bool) -> str | None:
    """The error of one training step of a wrapped BranchToyModel, if any."""
    tokens = torch.randint(VOCAB, (2, SEQ + 1), device=worker_state["device"])
    try:
        logits = wrapped(tokens[:, :-1], branch=branch)
        cross_entropy(logits, tokens[:, 1:]).backward()
        wrapped.finish_gradient_synchronization()
    except RuntimeError as error:
        return str(error)
    return None


def rank_dependent_branch() -> str | None:
    """Rank 0 alone calls the sharded `unused` layer: the error, if any."""
    torch.manual_seed(0)
    wrapped = FSDP(BranchToyModel().to(worker_state["device"]))
    return error_of_a_step(wrapped, branch=dist.get_rank() == 0)


def test_ranks_that_run_different_collectives_raise(run_on_ranks, backend):
    # Before, gloo aborted the process ("terminate called", "Connection reset by peer").
    for message in run_on_ranks(rank_dependent_branch):
        assert message is not None and "ranks ran different collectives" in message
        assert "rank 0: all-gather of unused.weight" in message
        assert "rank 1: all-gather of down.weight" in message


def rank_dependent_backward() -> str | None:
    """Both ranks call every layer, but on rank 1 no gradient flows through `unused`: its
    backward neither re-gathers nor reduce-scatters that unit. The error, if any."""
    torch.manual_seed(0)
    wrapped = FSDP(BranchToyModel().to(worker_state["device"]))
    if dist.get_rank() == 1:
        wrapped.module.unused.register_forward_hook(lambda _m, _args, out: out.detach())
    return error_of_a_step(wrapped, branch=True)


def test_ranks_whose_backwards_differ_raise(run_on_ranks, backend):
    # The backward's checks cover a reduce-scatter and the collective after it at once.
    for message in run_on_ranks(rank_dependent_backward):
        assert message is not None and "ranks ran different collectives" in message
        assert "unused.weight" in message
