"""The optimizer update of each part of a model launched as soon as backward has produced
that part's gradients, on a side CUDA stream.

After backward, an AdamW update over fp32 state is pure memory traffic (about 30 bytes per
parameter), while backward itself is mostly compute-bound matmuls. Backward produces the
last layer's gradients first: updating those parameters while backward still runs through
the earlier layers lets the two overlap instead of following each other.

The update is the optimizer's own (`AdamW._step_group`), per parameter the same arithmetic
as one `optimizer.step()` after backward, so the results are the same bit for bit; only the
moment each parameter is updated changes. A part's parameters must not be used again by the
rest of backward once their gradients are complete, which holds for the layers of a
Transformer (each layer's weights are used by its own forward and backward only).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from systems.optim.adamw import AdamW


class UpdateInBackward:
    """Launch `optimizer`'s update of each bucket (a list of parameters) when the last of its
    gradients has been accumulated during backward; call `finish()` after backward, where
    `optimizer.step()` would be.

    On CUDA the updates run on a side stream that waits for the backward stream at each
    launch, and `finish()` makes the current stream wait for them, so what follows sees
    updated parameters (a CUDA graph captures the fork and the join). Elsewhere each update
    runs in place of the hook. Parameters without a gradient by `finish()` are skipped, as
    `optimizer.step()` skips them; the rest of such a bucket is updated there.
    """

    def __init__(self, optimizer: AdamW, buckets: Iterable[Sequence[torch.Tensor]]) -> None:
        if not isinstance(optimizer, AdamW):
            raise TypeError(f"updates in backward need systems.optim.AdamW or a subclass "
                            f"(its per-group update), got {type(optimizer).__name__}")
        self.optimizer = optimizer
        group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        self._buckets: list[list[torch.Tensor]] = [list(bucket) for bucket in buckets]
        seen: set[int] = set()
        for bucket in self._buckets:
            for param in bucket:
                if id(param) not in group_of:
                    raise ValueError(f"a bucket holds a parameter of shape "
                                     f"{tuple(param.shape)} that the optimizer does not update")
                if id(param) in seen:
                    raise ValueError("a parameter appears in two buckets")
                seen.add(id(param))
        missing = [p for group in optimizer.param_groups for p in group["params"]
                   if id(p) not in seen]
        if missing:
            raise ValueError(f"{len(missing)} of the optimizer's parameters are in no bucket "
                             "(they would never be updated)")
        self._group_of = group_of
        self._remaining = [len(bucket) for bucket in self._buckets]
        self._launched = [False] * len(self._buckets)
        device = self._buckets[0][0].device if self._buckets and self._buckets[0] else None
        self._stream = (torch.cuda.Stream(device) if device is not None
                        and device.type == "cuda" else None)
        self._used_stream = False
        for index, bucket in enumerate(self._buckets):
            for param in bucket:
                param.register_post_accumulate_grad_hook(
                    lambda _param, index=index: self._gradient_ready(index))

    def _gradient_ready(self, index: int) -> None:
        self._remaining[index] -= 1
        if self._remaining[index] < 0:
            raise RuntimeError("a second backward before finish(): updates in backward "
                               "cannot accumulate gradients over several backward passes")
        if self._remaining[index] == 0:
            self._launch(index)

    def _launch(self, index: int) -> None:
        self._launched[index] = True
        params = [p for p in self._buckets[index] if p.grad is not None]
        if not params:
            return
        if self._stream is None:
            self._update(params)
            return
        self._stream.wait_stream(torch.cuda.current_stream(self._stream.device))
        self._used_stream = True
        with torch.cuda.stream(self._stream):
            self._update(params)

    @torch.no_grad()
    def _update(self, params: list[torch.Tensor]) -> None:
        by_group: dict[int, tuple[dict, list[torch.Tensor]]] = {}
        for param in params:
            group = self._group_of[id(param)]
            by_group.setdefault(id(group), (group, []))[1].append(param)
        for group, group_params in by_group.values():
            self.optimizer._step_group(group, group_params)

    def finish(self) -> None:
        """Update what backward left (buckets with a parameter that got no gradient), make
        the current stream wait for every update, and get ready for the next backward."""
        for index, launched in enumerate(self._launched):
            if not launched:
                self._launch(index)
        if self._used_stream:
            torch.cuda.current_stream(self._stream.device).wait_stream(self._stream)
        self._remaining = [len(bucket) for bucket in self._buckets]
        self._launched = [False] * len(self._buckets)
        self._used_stream = False
