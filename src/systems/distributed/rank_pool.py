"""A pool of rank processes that run functions together, with a deadline.

Each worker joins one process group through a file in a private temporary directory (no
TCP port, so concurrent runs cannot collide) and then serves calls: `pool.run(fn, *args)`
sends the same call to every rank and returns the per-rank results. A rank that raises
reports its traceback; a call that outlives its deadline makes every still-busy rank dump
its stack before the pool is torn down, so a hung collective fails loudly with all ranks'
stacks instead of hanging CI. Workers keep state between calls in `worker_state`, which is
how a benchmark builds a model once and then times steps one call at a time.

Nothing outlives the pool's owner. A call that does not finish normally (a rank failed,
the deadline passed, or the owner was interrupted, e.g. by pytest-timeout) closes the pool,
and each call's results carry its sequence number, so no call can see another's. If the
owner dies without closing the pool (SIGTERM, SIGKILL), the kernel kills the ranks
(Linux's parent-death signal) and a small watchdog process (`pool_watchdog.py`) kills any
rank still there and removes the temporary directory.
"""

from __future__ import annotations

import ctypes
import faulthandler
import itertools
import multiprocessing as mp
import os
import pickle
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from systems.common.hardware import gpu_count
from systems.distributed import pool_watchdog
from systems.distributed.process_group import apply_safe_env, init_rank

# Per-process state that survives between calls in a worker (empty in the parent).
worker_state: dict[str, Any] = {}

_STOP = "stop"
_STARTUP_S = 120.0  # importing torch on a loaded 2-core machine can take a while
_PEERS_GRACE_S = 5.0  # once a rank failed, its peers may be stuck in a collective
_STACKS_S = 2.0  # how long busy ranks get to write their stacks
_STARTUP_CALL = 0  # the sequence number of the start-up reports; calls count from 1
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class RankError(RuntimeError):
    """One or more ranks failed or missed the deadline; the message holds every report."""


def _dumps(obj: object) -> bytes:
    """Pickle by value. Not through shared memory as a multiprocessing queue would: a
    shared tensor's file descriptor can be taken once, but one pickled call goes to every
    rank, and a rank's result must not depend on the rank staying alive."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _type_name(obj: object) -> str:
    kind = type(obj)
    return kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")


def _call_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _pickled_call(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> bytes:
    """The call as the ranks receive it; a TypeError naming the part that cannot be sent."""
    try:
        return _dumps((fn, args, kwargs))
    except Exception as error:
        parts = [(f"the function {_call_name(fn)}", fn),
                 *((f"argument {i} (a {_type_name(a)})", a) for i, a in enumerate(args, 1)),
                 *((f"keyword argument {k!r} (a {_type_name(v)})", v) for k, v in kwargs.items())]
        culprit = next((label for label, part in parts if not _picklable(part)), "the call")
        raise TypeError(f"cannot send {culprit} to the ranks: {error} (rank functions must "
                        "be module-level and their arguments picklable)") from error


def _picklable(obj: object) -> bool:
    try:
        _dumps(obj)
    except Exception:
        return False
    return True


def _serve(call: bytes) -> tuple[bool, bytes | str]:
    """Run one pickled call: (True, its pickled result) or (False, what went wrong)."""
    try:
        fn, args, kwargs = pickle.loads(call)
        result = fn(*args, **kwargs)
    except BaseException:
        return False, "raised:\n" + traceback.format_exc()
    try:  # here, not in the queue's background thread, which would only print the error
        return True, _dumps(result)
    except Exception as error:
        return False, f"returned a {_type_name(result)}, which cannot be sent back: {error!r}"


def _die_with_owner(owner_pid: int) -> None:
    """Have the kernel kill this rank when its owner dies, even mid-collective (Linux).

    The signal follows the thread that started the rank, so the pool asks for it only when
    started from the main thread; otherwise the watchdog alone cleans up.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != owner_pid:  # the owner died before the request took effect
        os._exit(1)


def _worker(rank: int, world_size: int, backend: str, init_file: str, timeout_s: float,
            stack_file: str, owner_pid: int, die_with_owner: bool, calls: mp.Queue,
            results: mp.Queue) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's to handle
    if die_with_owner:
        _die_with_owner(owner_pid)
    apply_safe_env()
    with open(stack_file, "w") as stacks:
        # SIGUSR1 from the parent (deadline passed) dumps every thread's stack here.
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        try:
            device = init_rank(backend=backend, rank=rank, world_size=world_size,
                               init_method=f"file://{init_file}", timeout_s=timeout_s)
            worker_state["device"] = device
            if device.type == "cpu":
                # gloo ranks are forked, and a forked child inherits an OpenMP pool that is
                # not fork-safe: with more than one thread its first parallel op can hang
                # once the owner has used its threads. One thread each also keeps ranks
                # from oversubscribing the cores they share.
                torch.set_num_threads(1)
            results.put((_STARTUP_CALL, rank, True, _dumps(None)))
        except BaseException:
            results.put((_STARTUP_CALL, rank, False, "raised:\n" + traceback.format_exc()))
            return
        while (message := calls.get()) != _STOP:
            call_number, call = message
            results.put((call_number, rank, *_serve(call)))
        worker_state.clear()
        dist.destroy_process_group()


class RankPool:
    """`world_size` spawned processes in one process group (gloo on CPU, NCCL on GPUs)."""

    def __init__(self, world_size: int, backend: str = "gloo", timeout_s: float = 120.0) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if backend == "nccl":
            gpus = gpu_count()
            if gpus < world_size:
                raise ValueError(f"NCCL needs {world_size} GPUs, found {gpus}")
        self.world_size, self.backend, self.timeout_s = world_size, backend, timeout_s
        self._dir = Path(tempfile.mkdtemp(prefix="rankpool-"))
        # Forking skips re-importing torch in every worker (seconds each on a small CPU);
        # CUDA cannot be used in a forked child, so NCCL workers are spawned.
        context = mp.get_context("spawn" if backend == "nccl" else "fork")
        self._results: mp.Queue = context.Queue()
        self._calls = [context.Queue() for _ in range(world_size)]
        self._stack_files = [self._dir / f"stacks-rank{r}.txt" for r in range(world_size)]
        on_main_thread = threading.current_thread() is threading.main_thread()
        self._procs = [
            context.Process(
                target=_worker, daemon=True, name=f"rank{rank}",
                args=(rank, world_size, backend, str(self._dir / "rendezvous"), timeout_s,
                      str(self._stack_files[rank]), os.getpid(), on_main_thread,
                      self._calls[rank], self._results),
            )
            for rank in range(world_size)
        ]
        self._watchdog: subprocess.Popen | None = None
        self._call_numbers = itertools.count(_STARTUP_CALL + 1)
        self.alive = True
        with self._closed_unless_finished():
            for proc in self._procs:
                proc.start()
            self._watchdog = subprocess.Popen(
                [sys.executable, pool_watchdog.__file__, str(os.getpid()), str(self._dir),
                 *(str(proc.pid) for proc in self._procs)],
                stdin=subprocess.DEVNULL, start_new_session=True)  # outlives a Ctrl-C
            self._collect(_STARTUP_CALL, max(_STARTUP_S, timeout_s),
                          what="process-group start-up")

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None,
            **kwargs: Any) -> list[Any]:
        """Call `fn(*args, **kwargs)` on every rank; return the results in rank order.

        `fn` must be importable by name (a module-level function) and its arguments and
        results picklable; a `TypeError` naming the culprit says so before anything is
        sent. Raises `RankError` with every failing rank's traceback, or every busy rank's
        stack if the deadline passes. A call that does not finish (an error, or an
        interruption such as a test timeout) closes the pool: its process group may be
        mid-collective.
        """
        if not self.alive:
            raise RankError("the pool was closed after an earlier failure or interruption")
        call = _pickled_call(fn, args, kwargs)
        call_number = next(self._call_numbers)
        with self._closed_unless_finished():
            for call_queue in self._calls:
                call_queue.put((call_number, call))
            return self._collect(call_number, timeout_s or self.timeout_s, what=_call_name(fn))

    @contextmanager
    def _closed_unless_finished(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.close(force=True)
            raise

    def _collect(self, call_number: int, timeout_s: float, what: str) -> list[Any]:
        start = time.monotonic()
        results: dict[int, Any] = {}
        failures: dict[int, str] = {}
        first_failure: tuple[int, float] | None = None  # (rank, when)
        busy_reason = ""
        while len(results) + len(failures) < self.world_size:
            try:
                number, rank, ok, payload = self._results.get(timeout=0.05)
            except queue.Empty:
                for rank, proc in enumerate(self._procs):
                    if not proc.is_alive() and rank not in results and rank not in failures:
                        failures[rank] = f"exited with code {proc.exitcode}"
            else:
                if number == call_number:  # anything else was left by a call cut short
                    self._record(rank, ok, payload, results, failures)
            now = time.monotonic()
            if failures and first_failure is None:
                first_failure = (min(failures), now)
            if now > start + timeout_s:
                busy_reason = f"did not finish {what!r} within {timeout_s:g} s"
                break
            if first_failure is not None and now > first_failure[1] + _PEERS_GRACE_S:
                busy_reason = (f"was still running {what!r} {now - first_failure[1]:.1f} s "
                               f"after rank {first_failure[0]} failed")
                break
        if not failures and len(results) == self.world_size:
            return [results[r] for r in range(self.world_size)]
        busy = [r for r in range(self.world_size) if r not in results and r not in failures]
        self._raise(what, failures, busy, busy_reason)

    @staticmethod
    def _record(rank: int, ok: bool, payload: bytes | str, results: dict[int, Any],
                failures: dict[int, str]) -> None:
        if not ok:
            failures[rank] = payload
            return
        try:
            results[rank] = pickle.loads(payload)
        except Exception:
            failures[rank] = "returned a result that cannot be loaded here:\n" + (
                traceback.format_exc())

    def _raise(self, what: str, failures: dict[int, str], busy: list[int],
               busy_reason: str) -> NoReturn:
        dumping = [r for r in busy if self._procs[r].is_alive()]
        for rank in dumping:
            os.kill(self._procs[rank].pid, signal.SIGUSR1)
        deadline = time.monotonic() + _STACKS_S
        while any(not self._stacks(r) for r in dumping) and time.monotonic() < deadline:
            time.sleep(0.05)  # faulthandler writes the stacks
        time.sleep(0.1 if dumping else 0.0)  # let the last lines land
        reports = [f"rank {r} {report}" for r, report in sorted(failures.items())]
        reports += [f"rank {r} {busy_reason}; its stacks:\n{self._stacks(r) or '(none written)'}"
                    for r in busy]
        raise RankError(f"{what} failed on {self.world_size} ranks "
                        f"({self.backend}):\n\n" + "\n".join(reports))

    def _stacks(self, rank: int) -> str:
        path = self._stack_files[rank]
        return path.read_text() if path.exists() else ""

    def close(self, force: bool = False) -> None:
        """Stop the workers (politely unless `force`) and remove the rendezvous files."""
        polite = self.alive and not force
        self.alive = False
        if polite:
            for call_queue in self._calls:
                call_queue.put(_STOP)
            for proc in self._procs:
                proc.join(timeout=10)
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        if self._watchdog is not None and self._watchdog.poll() is None:
            self._watchdog.kill()
            self._watchdog.wait()
        for any_queue in (*self._calls, self._results):
            any_queue.cancel_join_thread()  # a killed rank never reads what is left
            any_queue.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
