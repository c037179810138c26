"""Cleans up after a rank pool whose owner died without closing it (SIGTERM, SIGKILL, ...).

    python pool_watchdog.py OWNER_PID FOLDER RANK_PID...

The pool starts this script by path right after its ranks: it needs only the standard
library, so it starts in milliseconds and without torch, whatever the start method of the
ranks. It waits for its parent, the owner, to go away, then kills the ranks that are still
running and removes the pool's folder. A pool that closes normally terminates it first.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from contextlib import suppress
from pathlib import Path

POLL_S = 0.2
RANKS_GONE_S = 10.0


def start_time(pid: int) -> str | None:
    """When `pid` started (tells a recycled pid apart from it); None once it is gone.

    Zombies count as gone: they hold no resources and are only waiting to be reaped.
    """
    if not Path("/proc").is_dir():  # no start times here: trust the pid
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return "alive"
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    state, started = fields[0], fields[19]  # fields 3 and 22 of proc(5)
    return None if state in ("Z", "X") else started


def main(argv: list[str]) -> None:
    owner, folder, ranks = int(argv[1]), Path(argv[2]), [int(pid) for pid in argv[3:]]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the owner
    started = {pid: start_time(pid) for pid in ranks}
    while os.getppid() == owner:  # the owner died: this process was handed to another
        time.sleep(POLL_S)
    for pid, when in started.items():
        if when is not None and start_time(pid) == when:
            with suppress(ProcessLookupError):  # it may have just gone by itself
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + RANKS_GONE_S
    while any(start_time(pid) is not None for pid in started) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv)
