"""A train step replayed from a CUDA graph: one launch per step, whatever the host's speed.

A compiled 2.7B-parameter step queues well over a thousand kernels; on a slow host, queuing
them takes as long as the GPU takes to run them, so the GPU waits. Captured once, the whole
step (forward, loss, backward, optimizer) replays with a single launch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class CapturedStep:
    """Call `step` normally for the first `warmup` calls, capture the next call in a CUDA
    graph, and from then on replay that graph: every call is one step.

    Warm-up calls must leave nothing lazy for the captured one: compilation, autotuning,
    optimizer state and memory pools all happen before capture. What capture requires of
    `step`: its inputs are tensors that stay where they are (copy a new batch into them to
    train on new data); it launches CUDA work without waiting for the GPU; its optimizer
    keeps step counts on the GPU (`MixedPrecisionAdamW`, or torch's with `capturable=True`).
    Host-side changes after capture, such as a new learning rate, do not reach the replays.
    A checkpoint loaded after capture reaches them only where the load writes into the
    existing tensors: `Module.load_state_dict` and `MixedPrecisionAdamW.load_state_dict` do;
    torch's optimizers replace their state tensors, which the graph then no longer reads.

    Each call returns what the captured call returned; replays overwrite those tensors, so
    copy what you keep.

    `stream` is the side stream the warm-up calls and the capture run on; set another
    (e.g. of a higher priority) before the first call to capture the step on it.
    """

    def __init__(self, step: Callable[[], object], warmup: int = 2,
                 before_capture: Callable[[], None] | None = None) -> None:
        if not torch.cuda.is_available():
            raise ValueError("CapturedStep needs a CUDA device")
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (compilation and lazy state must not "
                             f"happen during capture), got {warmup}")
        self._step = step
        self._warmup = warmup
        self._before_capture = before_capture
        self._calls = 0
        self.stream = torch.cuda.Stream()
        self._output: object = None
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self) -> object:
        if self.graph is None:
            self._calls += 1
            if self._calls <= self._warmup:
                return self._warm_up()
            self._capture()
        self.graph.replay()
        return self._output

    def _warm_up(self) -> object:
        # On a side stream, as capture does: some libraries set up per-stream state lazily.
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            output = self._step()
        torch.cuda.current_stream().wait_stream(self.stream)
        return output

    def _capture(self) -> None:
        # Captured on the warm-up stream: autograd's gradient accumulators remember the
        # stream they were created on and would otherwise synchronise across streams.
        # The capture allocates from a pool of its own, which cannot reuse blocks that the
        # warm-up steps left allocated or cached: free what the caller can (`before_capture`,
        # e.g. the last step's gradients) and hand the cache back first. Holding a 2.7B
        # model's fp32 gradients twice ran out of memory on an 80 GB GPU.
        if self._before_capture is not None:
            self._before_capture()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            self._output = self._step()
        self.graph = graph
