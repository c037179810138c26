"""The N-rank fixture: `run_on_ranks(fn, *args, world_size=2)` runs `fn` on every rank.

Ranks live in pools (one per world size and backend) that are started once per session
and reused: starting processes that import torch is the slow part on CPU. A failing or
hung call reports every rank's traceback or stack and closes its pool, and so does a call
cut short (e.g. by pytest-timeout); the next call starts a fresh one. `backend` runs a test
on gloo (CPU) and on NCCL (GPUs, skipped with the reason when there are too few). Rank
functions must be module-level (picklable by name).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from systems.common.hardware import gpu_count
from systems.distributed import RankPool

# A collective should take well under a second here; a stuck one fails the test.
DEADLINE_S = float(os.environ.get("SYSTEMS_DIST_DEADLINE_S", "120"))


@pytest.fixture(scope="session")
def rank_pools() -> Iterator[dict[tuple[int, str], RankPool]]:
    pools: dict[tuple[int, str], RankPool] = {}
    yield pools
    for pool in pools.values():
        pool.close()


@pytest.fixture(params=["gloo", "nccl"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def run_on_ranks(rank_pools: dict[tuple[int, str], RankPool], request: pytest.FixtureRequest,
                 ) -> Callable[..., list[Any]]:
    backend = request.getfixturevalue("backend") if "backend" in request.fixturenames else "gloo"

    def run(fn: Callable[..., Any], *args: Any, world_size: int = 2, **kwargs: Any) -> list[Any]:
        if backend == "nccl" and gpu_count() < world_size:
            pytest.skip(f"NCCL at world size {world_size} needs {world_size} GPUs, "
                        f"found {gpu_count()}")
        key = (world_size, backend)
        if key not in rank_pools or not rank_pools[key].alive:
            rank_pools[key] = RankPool(world_size, backend, timeout_s=DEADLINE_S)
        return rank_pools[key].run(fn, *args, **kwargs)

    return run
