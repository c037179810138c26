"""A process that owns a RankPool whose ranks are blocked in gloo, for tests that kill it.

    python pool_owner.py MARKER_DIR [main|thread]

Each rank touches MARKER_DIR/rank<r> and then waits to receive from its peer, which never
sends; the owner waits for the ranks, from its main thread or from another thread. The
test kills the owner and checks what is left. SIGUSR1 makes it print its threads' stacks.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist

from systems.distributed import RankPool


def block_in_gloo(marker_dir: str) -> None:
    Path(marker_dir, f"rank{dist.get_rank()}").touch()
    dist.recv(torch.zeros(1), src=1 - dist.get_rank())  # both ranks receive: a deadlock


def own_a_blocked_pool(marker_dir: str) -> None:
    with RankPool(2, timeout_s=600) as pool:  # longer than any test: gloo must not give up
        pool.run(block_in_gloo, marker_dir)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # a test that waits too long asks where it is
    # Ctrl-C's KeyboardInterrupt, even where this process was started with SIGINT ignored
    # (as a shell does for a background job), which Python would otherwise keep.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.argv[2:] == ["thread"]:
        owner = threading.Thread(target=own_a_blocked_pool, args=(sys.argv[1],))
        owner.start()
        owner.join()
    else:
        own_a_blocked_pool(sys.argv[1])
