"""ShardedOptimizer against the unsharded optimizer, and the balance of its shards."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from distributed_cases import train_and_compare

from systems.distributed.rank_pool import worker_state
from systems.optim import AdamW, ShardedOptimizer


@pytest.mark.parametrize("trial", range(2))
def test_sharded_adamw_with_ddp_matches_single_process(run_on_ranks, backend, trial):
    results = run_on_ranks(train_and_compare, "bucketed", "tiny_lm", seed=trial,
                           options={"bucket_size_mb": None}, sharded_optimizer=True)
    assert all(r["compared"] > 0 for r in results)


def sharded_equals_unsharded() -> list[int]:
    """Identical gradients on every rank: sharded AdamW must give the same bits as AdamW,
    across two parameter groups, a group added mid-training and an LR change."""
    device = worker_state["device"]
    generator = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (13,), (3, 3, 2), (1,), (11, 4), (29,)]
    first = [torch.randn(s, generator=generator).to(device).requires_grad_() for s in shapes]
    late = [torch.randn(9, 2, generator=generator).to(device).requires_grad_()]
    mine = [p.detach().clone().requires_grad_() for p in first + late]
    groups = [{"params": first[:3]}, {"params": first[3:], "lr": 3e-2, "weight_decay": 0.0}]
    my_groups = [{"params": mine[:3]}, {"params": mine[3:6], "lr": 3e-2, "weight_decay": 0.0}]
    reference = AdamW(groups, lr=1e-2, weight_decay=0.1)
    sharded = ShardedOptimizer(my_groups, AdamW, lr=1e-2, weight_decay=0.1)
    for step in range(5):
        if step == 2:
            reference.add_param_group({"params": late, "lr": 5e-3})
            sharded.add_param_group({"params": mine[6:], "lr": 5e-3})
        if step == 3:
            reference.param_groups[0]["lr"] = sharded.param_groups[0]["lr"] = 2e-2
        grads = [torch.randn(p.shape, generator=generator).to(device) for p in mine]
        for ref_param, param, grad in zip(first + late, mine, grads, strict=True):
            ref_param.grad, param.grad = grad.clone(), grad.clone()
        reference.step()
        sharded.step()
    for ref_param, param in zip(first + late, mine, strict=True):
        assert torch.equal(ref_param, param)
    local = sum(p.numel() for g in sharded.local_optimizer.param_groups for p in g["params"])
    loads = [0] * dist.get_world_size()
    dist.all_gather_object(loads, local)
    return loads


@pytest.mark.parametrize("world_size", [2, 4])
def test_sharded_equals_unsharded_and_balances(run_on_ranks, backend, world_size):
    loads = run_on_ranks(sharded_equals_unsharded, world_size=world_size)[0]
    total, largest = 35 + 13 + 18 + 1 + 44 + 29 + 18, 44
    assert sum(loads) == total
    # Greedy largest-first assignment: no rank exceeds the fair share by more than one param.
    assert max(loads) <= total / world_size + largest
