"""Lifetimes of the rank pool: its owner dying, calls cut short, pickling problems.

Killed owners run in a child process (tests/distributed/pool_owner.py); their ranks and
the pool's helper processes are found by the child's command line, which names this test's
temporary folder.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from systems.distributed import RankError, RankPool

HERE = Path(__file__).parent
REPO = HERE.parent.parent
# Bounds for a loaded 2-core machine; the fixed code needs a fraction of each.
START_S = 120.0  # a child that imports torch and starts a pool
GONE_S = 15.0  # processes and folders after their owner died
PROMPT_S = 10.0  # an error that needs no waiting


def _child_env(tmpdir: Path) -> dict[str, str]:
    env = dict(os.environ, TMPDIR=str(tmpdir))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    return env


def _alive(pid: int) -> bool:
    """Running, that is: not gone and not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _live_processes_naming(text: str) -> list[int]:
    """Pids of running processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            named = entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(
                errors="replace")
        except OSError:  # it exited while we looked
            continue
        if named and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _wait_or_show_stacks(owner: subprocess.Popen, stderr: Path) -> None:
    """Wait for the owner to exit; if it does not within GONE_S, fail with its stacks."""
    try:
        owner.wait(timeout=GONE_S)
    except subprocess.TimeoutExpired:
        owner.send_signal(signal.SIGUSR1)  # pool_owner.py prints its threads' stacks
        time.sleep(1.0)
        pytest.fail(f"the owner was still running {GONE_S:g} s after the signal; its "
                    f"stderr:\n{stderr.read_text()}")


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(("signum", "owning_thread"), [
    (signal.SIGTERM, "main"), (signal.SIGKILL, "main"), (signal.SIGINT, "main"),
    # Off the main thread the kernel's parent-death signal is not used: the watchdog acts.
    (signal.SIGKILL, "thread"),
], ids=lambda p: signal.Signals(p).name if isinstance(p, int) else p)
def test_ranks_and_folder_go_when_the_owner_dies(tmp_path, signum, owning_thread):
    markers, tmpdir = tmp_path / "markers", tmp_path / "tmp"
    markers.mkdir()
    tmpdir.mkdir()
    stderr = tmp_path / "owner.stderr"
    owner = subprocess.Popen(
        [sys.executable, str(HERE / "pool_owner.py"), str(markers), owning_thread],
        env=_child_env(tmpdir), cwd=REPO, stderr=stderr.open("w"))
    try:
        assert _wait_for(lambda: len(list(markers.iterdir())) == 2 or owner.poll() is not None,
                         START_S), "the ranks never reached the collective"
        assert owner.poll() is None, f"the owner exited early with code {owner.returncode}"
        ranks = [pid for pid in _live_processes_naming(str(tmp_path)) if pid != owner.pid]
        assert len(ranks) >= 2
        assert len(list(tmpdir.glob("rankpool-*"))) == 1
        owner.send_signal(signum)
        _wait_or_show_stacks(owner, stderr)
        assert _wait_for(lambda: not _live_processes_naming(str(tmp_path)), GONE_S), (
            f"processes of the pool outlived their owner: {_live_processes_naming(str(tmp_path))}")
        assert _wait_for(lambda: not list(tmpdir.glob("rankpool-*")), GONE_S), (
            f"left behind: {list(tmpdir.iterdir())}")
    finally:  # a failed run must not leave its orphans to the rest of the suite
        for pid in _live_processes_naming(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)
        owner.wait()


def test_a_pool_outlives_the_thread_that_started_it():
    # The kernel's parent-death signal follows the starting thread, not the process: a
    # pool started off the main thread must not ask for it.
    pools: list[RankPool] = []
    starter = threading.Thread(target=lambda: pools.append(RankPool(2)))
    starter.start()
    starter.join()
    with pools[0] as pool:
        time.sleep(0.5)  # the signal, if asked for, is immediate
        assert pool.run(identity, "after") == ["after", "after"]


class _Interrupted(Exception):
    """What pytest-timeout's signal method raises in the middle of a test."""


@contextmanager
def _interrupt_after(seconds: float) -> Iterator[None]:
    def interrupt(signum, frame):
        raise _Interrupted(f"interrupted after {seconds} s")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_call_cut_short_discards_the_pool():
    with RankPool(2) as pool:
        ranks = pool.run(os.getpid)
        with _interrupt_after(1.0), pytest.raises(_Interrupted):
            pool.run(time.sleep, 30)
        assert not pool.alive
        with pytest.raises(RankError, match="closed"):
            pool.run(os.getpid)
        assert _wait_for(lambda: not any(_alive(pid) for pid in ranks), PROMPT_S)


def test_results_of_another_call_are_dropped():
    # White-box: what a rank of a call cut short would leave behind (call number, rank,
    # ok, pickled result), sent ahead of the next call's results.
    with RankPool(2) as pool:
        for rank in range(2):
            pool._results.put((0, rank, True, pickle.dumps("stale")))
        assert pool.run(identity, "own") == ["own", "own"]


def test_after_a_pytest_timeout_the_next_test_gets_its_own_results(tmp_path):
    child = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "timeout_cases.py"), "--timeout=900",
         "-rA", "-p", "no:cacheprovider", "-o", "addopts="],
        env=_child_env(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=300)
    output = child.stdout + child.stderr
    assert re.search(r"PASSED \S*test_start_the_pool", output), output
    assert re.search(r"FAILED \S*test_cut_by_the_timeout", output), output
    assert "+ Timeout +" in output, output
    assert re.search(r"PASSED \S*test_gets_its_own_results", output), output


def identity(value: object) -> object:
    return value


def return_a_lock() -> object:
    return threading.Lock()


def test_an_unpicklable_function_fails_before_anything_is_sent():
    with RankPool(2, timeout_s=60) as pool:
        start = time.monotonic()
        with pytest.raises(TypeError, match="<lambda>"):
            pool.run(lambda: 1)
        with pytest.raises(TypeError, match=r"argument 1 \(a _thread\.lock\)"):
            pool.run(identity, threading.Lock())
        with pytest.raises(TypeError, match=r"keyword argument 'value' \(a generator\)"):
            pool.run(identity, value=(i for i in range(3)))
        assert time.monotonic() - start < PROMPT_S
        assert pool.alive, "nothing was sent, so the pool stays usable"
        assert pool.run(identity, 7) == [7, 7]


def test_an_unpicklable_result_is_that_ranks_error_at_once():
    with RankPool(2, timeout_s=60) as pool:
        start = time.monotonic()
        with pytest.raises(RankError) as error:
            pool.run(return_a_lock)
        assert time.monotonic() - start < PROMPT_S
    message = str(error.value)
    for rank in (0, 1):
        assert f"rank {rank} returned a _thread.lock, which cannot be sent back" in message
    assert "did not finish" not in message


def fail_on_rank_one_while_rank_zero_waits() -> None:
    if dist.get_rank() == 1:
        raise ValueError("planted failure on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 1 never joins


def test_peers_of_a_failed_rank_are_reported_with_the_time_they_were_given():
    with RankPool(2, timeout_s=60) as pool:
        start = time.monotonic()
        with pytest.raises(RankError) as error:
            pool.run(fail_on_rank_one_while_rank_zero_waits)
        elapsed = time.monotonic() - start
    message = str(error.value)
    assert "planted failure on rank 1" in message
    assert "within 60 s" not in message, "the deadline was not what stopped rank 0"
    waited = re.search(r"rank 0 was still running '\w+' ([\d.]+) s after rank 1 failed", message)
    assert waited, message
    assert 1.0 <= float(waited.group(1)) <= elapsed
