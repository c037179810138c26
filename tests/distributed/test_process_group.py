"""The rank pool behind the N-rank fixture: results, failures, deadlines, environment."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from systems.distributed import RankError, RankPool
from systems.distributed.process_group import SAFE_MULTI_GPU_ENV


def rank_sum_and_env() -> tuple[int, float, dict[str, str]]:
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    return dist.get_rank(), value.item(), {k: os.environ.get(k) for k in SAFE_MULTI_GPU_ENV}


def fail_on_odd_ranks() -> None:
    if dist.get_rank() % 2:
        raise ValueError(f"planted failure on rank {dist.get_rank()}")


def hang_in_collective_on_rank_zero() -> None:
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # the other ranks never join


@pytest.mark.parametrize("world_size", [2, 4, 6])
def test_results_in_rank_order_with_safe_env(run_on_ranks, world_size):
    results = run_on_ranks(rank_sum_and_env, world_size=world_size)
    total = world_size * (world_size + 1) / 2
    assert [r[:2] for r in results] == [(rank, total) for rank in range(world_size)]
    assert all(r[2] == SAFE_MULTI_GPU_ENV for r in results)


def test_every_failing_rank_reports_its_traceback():
    with RankPool(4) as pool, pytest.raises(RankError) as error:
        pool.run(fail_on_odd_ranks)
    message = str(error.value)
    for rank in (1, 3):
        assert f"rank {rank} raised" in message
        assert f"planted failure on rank {rank}" in message
    assert "rank 0 raised" not in message


def test_hung_collective_hits_the_deadline_with_stacks():
    with RankPool(2, timeout_s=60) as pool:
        with pytest.raises(RankError) as error:
            pool.run(hang_in_collective_on_rank_zero, timeout_s=2)
        assert not pool.alive
    message = str(error.value)
    assert "rank 0 did not finish 'hang_in_collective_on_rank_zero' within 2 s" in message
    assert "hang_in_collective_on_rank_zero" in message.split("its stacks:", 1)[1]
