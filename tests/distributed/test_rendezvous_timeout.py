"""A rendezvous whose other ranks never start ends within its timeout with a last line that
says what was missing, where, and how to fix it (`systems dist --timeout-s`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import systems

TIMEOUT_S = 3
# The bound on the whole process: the timeout plus importing torch on a busy machine.
BOUND_S = TIMEOUT_S + 90


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("rank", [0, 1], ids=["rank 0 waits for rank 1", "rank 1 without 0"])
def test_a_world_of_two_with_one_rank_started_fails_in_bounded_time(rank):
    src = str(Path(systems.__file__).parents[1])
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "systems", "dist", "--backend", "gloo",
                             "--timeout-s", str(TIMEOUT_S), "allreduce"],
                            capture_output=True, text=True, env=env, timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert result.returncode == 1, result.stderr[-3000:]
    assert elapsed < BOUND_S
    # torch's C++ logger may print its own lines first (a client's socket timeout); ours ends
    last = result.stderr.strip().splitlines()[-1]
    assert f"rank {rank} of a world of 2 could not form the process group" in last
    assert f"within {TIMEOUT_S} s" in last and "start every rank" in last
