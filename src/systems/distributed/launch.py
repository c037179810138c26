"""A pool of rank processes that run functions together, with a deadline.

Each worker joins one process group through a file in a private temporary directory (no
TCP port, so concurrent runs cannot collide) and then serves calls: `pool.run(fn, *args)`
sends the same call to every rank and returns the per-rank results. A rank that raises
reports its traceback; a call that outlives its deadline makes every still-busy rank dump
its stack before the pool is torn down, so a hung collective fails loudly with all ranks'
stacks instead of hanging CI. Workers keep state between calls in `worker_state`, which is
how a benchmark builds a model once and then times steps one call at a time.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import queue
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from systems.bench.hardware import gpu_count
from systems.distributed.process_group import apply_safe_env, init_rank

# Per-process state that survives between calls in a worker (empty in the parent).
worker_state: dict[str, Any] = {}

_STOP = "stop"
_STARTUP_S = 120.0  # importing torch on a loaded 2-core machine can take a while


class RankError(RuntimeError):
    """One or more ranks failed or missed the deadline; the message holds every report."""


def _worker(rank: int, world_size: int, backend: str, init_file: str, timeout_s: float,
            stack_file: str, calls: mp.Queue, results: mp.Queue) -> None:
    apply_safe_env()
    with open(stack_file, "w") as stacks:
        # SIGUSR1 from the parent (deadline passed) dumps every thread's stack here.
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        try:
            device = init_rank(backend=backend, rank=rank, world_size=world_size,
                               init_method=f"file://{init_file}", timeout_s=timeout_s)
            worker_state["device"] = device
            if device.type == "cpu":  # ranks share the cores: oversubscribing slows all
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
            results.put((rank, True, None))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
            return
        while (call := calls.get()) != _STOP:
            fn, args, kwargs = call
            try:
                results.put((rank, True, fn(*args, **kwargs)))
            except BaseException:
                results.put((rank, False, traceback.format_exc()))
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
        self._procs = [
            context.Process(
                target=_worker, daemon=True, name=f"rank{rank}",
                args=(rank, world_size, backend, str(self._dir / "rendezvous"), timeout_s,
                      str(self._stack_files[rank]), self._calls[rank], self._results),
            )
            for rank in range(world_size)
        ]
        for proc in self._procs:
            proc.start()
        self.alive = True
        self._collect(max(_STARTUP_S, timeout_s), what="process-group start-up")

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None,
            **kwargs: Any) -> list[Any]:
        """Call `fn(*args, **kwargs)` on every rank; return the results in rank order.

        `fn` must be importable by name (a module-level function). Raises `RankError` with
        every failing rank's traceback, or every busy rank's stack if the deadline passes;
        after an error the pool is closed (its process group may be mid-collective).
        """
        if not self.alive:
            raise RankError("the pool was closed after an earlier failure")
        for call_queue in self._calls:
            call_queue.put((fn, args, kwargs))
        return self._collect(timeout_s or self.timeout_s, what=getattr(fn, "__name__", str(fn)))

    def _collect(self, timeout_s: float, what: str) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        results: dict[int, Any] = {}
        failures: dict[int, str] = {}
        first_failure: float | None = None
        while len(results) + len(failures) < self.world_size:
            try:
                rank, ok, payload = self._results.get(timeout=0.05)
                (results if ok else failures)[rank] = payload
            except queue.Empty:
                for rank, proc in enumerate(self._procs):
                    if not proc.is_alive() and rank not in results and rank not in failures:
                        failures[rank] = f"process exited with code {proc.exitcode}"
            now = time.monotonic()
            if failures and first_failure is None:
                first_failure = now
            # Once one rank failed, its peers may be stuck in a collective: stop soon after.
            if now > deadline or (first_failure is not None and now > first_failure + 5.0):
                break
        if not failures and len(results) == self.world_size:
            return [results[r] for r in range(self.world_size)]
        busy = [r for r in range(self.world_size) if r not in results and r not in failures]
        self._raise(what, timeout_s, failures, busy)

    def _raise(self, what: str, timeout_s: float, failures: dict[int, str],
               busy: list[int]) -> NoReturn:
        for rank in busy:
            if self._procs[rank].is_alive():
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
        time.sleep(0.5 if busy else 0.0)  # let faulthandler write the stacks
        reports = [f"rank {r} raised:\n{tb}" for r, tb in sorted(failures.items())]
        for rank in busy:
            stacks = self._stack_files[rank].read_text() if self._stack_files[rank].exists() else ""
            reports.append(f"rank {rank} did not finish {what!r} within {timeout_s:.0f} s; "
                           f"its stacks:\n{stacks or '(none written)'}")
        self.close(force=True)
        raise RankError(f"{what} failed on {self.world_size} ranks "
                        f"({self.backend}):\n\n" + "\n".join(reports))

    def close(self, force: bool = False) -> None:
        """Stop the workers (politely unless `force`) and remove the rendezvous files."""
        if self.alive and not force:
            for call_queue in self._calls:
                call_queue.put(_STOP)
            for proc in self._procs:
                proc.join(timeout=10)
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self.alive = False
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
