"""ShardedOptimizer checkpoints: per-rank resume, consolidation, and loading across world sizes.

Every rank sees the same gradients, so a sharded run is bitwise equal to an unsharded one
(test_sharded_optimizer.py); a resumed run must then be bitwise equal to an uninterrupted
one, whatever world size it resumes at, since each parameter's update is the same
arithmetic wherever it runs.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from checkpoint_cases import through_a_file

from systems.distributed.rank_pool import worker_state
from systems.optim import AdamW, ShardedOptimizer

SHAPES = [(7, 5), (13,), (3, 3, 2), (1,), (11, 4), (29,)]
STEPS, SAVED_AT = 6, 3
HYPER = {"lr": 1e-2, "weight_decay": 0.1}


def fresh_params(device: torch.device) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator).to(device).requires_grad_()
            for shape in SHAPES]


def groups_of(params: list[torch.Tensor]) -> list[dict]:
    return [{"params": params[:3]}, {"params": params[3:], "lr": 3e-2, "weight_decay": 0.0}]


def train(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], steps: range) -> None:
    """Steps `steps` of a fixed sequence: random gradients (the same on every rank) and an
    LR change at step 1, so that hyperparameters have to be restored as well."""
    for step in steps:
        if step == 1:
            optimizer.param_groups[0]["lr"] = 2e-2
        generator = torch.Generator().manual_seed(100 + step)
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator).to(param.device)
        optimizer.step()


def uninterrupted_params(device: torch.device) -> list[torch.Tensor]:
    params = fresh_params(device)
    train(AdamW(groups_of(params), **HYPER), params, range(STEPS))
    return params


def resume_per_rank() -> None:
    """Save each rank's shard after SAVED_AT steps, load it into a new optimizer over the
    saved parameters, finish: bitwise equal to an uninterrupted sharded run."""
    device = worker_state["device"]
    reference = fresh_params(device)
    train(ShardedOptimizer(groups_of(reference), AdamW, **HYPER), reference, range(STEPS))

    params = fresh_params(device)
    first = ShardedOptimizer(groups_of(params), AdamW, **HYPER)
    train(first, params, range(SAVED_AT))
    saved = through_a_file(first.state_dict())
    resumed = [p.detach().clone().requires_grad_() for p in params]
    optimizer = ShardedOptimizer(groups_of(resumed), AdamW, **HYPER)
    optimizer.load_state_dict(saved)
    assert optimizer.param_groups[0]["lr"] == 2e-2  # the LR set during training came back
    train(optimizer, resumed, range(SAVED_AT, STEPS))
    for want, got in zip(reference, resumed, strict=True):
        assert torch.equal(got, want)


def test_per_rank_state_dict_resumes_bitwise(run_on_ranks, backend):
    run_on_ranks(resume_per_rank)


def trained_shard() -> dict:
    device = worker_state["device"]
    params = fresh_params(device)
    optimizer = ShardedOptimizer(groups_of(params), AdamW, **HYPER)
    train(optimizer, params, range(SAVED_AT))
    return through_a_file(optimizer.state_dict())


def rejects_mismatched_state(saved: list[dict], full: dict) -> None:
    """`saved`: every rank's state dict of a two-rank run; `full`: its consolidation."""
    device = worker_state["device"]
    rank, world = dist.get_rank(), dist.get_world_size()
    params = fresh_params(device)
    optimizer = ShardedOptimizer(groups_of(params), AdamW, **HYPER)
    if world != len(saved):
        with pytest.raises(ValueError, match="world size"):
            optimizer.load_state_dict(saved[rank % len(saved)])
        return
    with pytest.raises(ValueError, match="rank"):
        optimizer.load_state_dict(saved[1 - rank])
    fewer = ShardedOptimizer(groups_of(params[:-1]), AdamW, **HYPER)
    for state in (saved[rank], full):
        with pytest.raises(ValueError, match="parameters"):
            fewer.load_state_dict(state)
    # A shard is not a full state: a plain optimizer must not take it.
    with pytest.raises(KeyError):
        AdamW(groups_of(params), **HYPER).load_state_dict(saved[rank])


def test_load_rejects_mismatched_state(run_on_ranks, backend):
    saved = run_on_ranks(trained_shard)
    full = run_on_ranks(trained_and_consolidated, None)[0]["optimizer"]
    run_on_ranks(rejects_mismatched_state, saved, full)
    run_on_ranks(rejects_mismatched_state, saved, full, world_size=4)


def trained_and_consolidated(to_rank: int | None) -> dict | None:
    """Parameters and the consolidated optimizer state after SAVED_AT sharded steps."""
    device = worker_state["device"]
    params = fresh_params(device)
    optimizer = ShardedOptimizer(groups_of(params), AdamW, **HYPER)
    train(optimizer, params, range(SAVED_AT))
    full = optimizer.consolidated_state_dict(to_rank=to_rank)
    if full is None:
        return None
    return {"optimizer": through_a_file(full), "params": [p.detach().cpu() for p in params]}


def test_consolidates_on_one_rank_or_all(run_on_ranks, backend):
    on_one = run_on_ranks(trained_and_consolidated, 1)
    assert on_one[0] is None and on_one[1] is not None
    full = on_one[1]["optimizer"]
    assert sorted(full["state"]) == list(range(len(SHAPES)))  # every parameter's state
    for index, shape in enumerate(SHAPES):
        assert full["state"][index]["exp_avg"].shape == shape
        assert full["state"][index]["step"] == SAVED_AT
    on_all = run_on_ranks(trained_and_consolidated, None)
    for result in on_all:
        assert torch.equal(torch.cat([p.flatten() for p in result["params"]]),
                           torch.cat([p.flatten() for p in on_one[1]["params"]]))
        for index, state in result["optimizer"]["state"].items():
            for key, value in state.items():
                assert torch.equal(torch.as_tensor(value),
                                   torch.as_tensor(full["state"][index][key]))
        assert result["optimizer"]["param_groups"] == full["param_groups"]


def resume_from_full(saved: dict, sharded: bool) -> None:
    """Finish the run from a consolidated state with a ShardedOptimizer at this world size
    or a plain AdamW: bitwise equal to an uninterrupted run."""
    device = worker_state["device"]
    saved = through_a_file(saved)
    params = [p.to(device).requires_grad_() for p in saved["params"]]
    optimizer = (ShardedOptimizer(groups_of(params), AdamW, **HYPER) if sharded
                 else AdamW(groups_of(params), **HYPER))
    optimizer.load_state_dict(saved["optimizer"])
    train(optimizer, params, range(SAVED_AT, STEPS))
    for want, got in zip(uninterrupted_params(device), params, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_consolidated_state_resumes_at_any_world_size(run_on_ranks, backend, world_size):
    saved = run_on_ranks(trained_and_consolidated, 0)[0]
    run_on_ranks(resume_from_full, saved, True, world_size=world_size)


def test_consolidated_state_loads_into_plain_optimizer(run_on_ranks, backend):
    saved = run_on_ranks(trained_and_consolidated, 0)[0]
    run_on_ranks(resume_from_full, saved, False)
