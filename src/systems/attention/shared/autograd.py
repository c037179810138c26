"""What the flash attention autograd Functions share: what forward saves for backward, and
refusing second derivatives with a clear error instead of a wrong answer.

Every flash forward returns (o, L) and saves L, q, k, v and o with the mask flag; every
backward recomputes the gradients from those (`forward_saving_lse`, `backward_from_saved`).

The flash backward passes recompute attention from L, which autograd sees as a constant:
differentiating their gradients again would silently drop L's dependence on q and k. So a
backward wrapped here computes its gradients without recording a graph, and when asked to
(`create_graph=True`) hands back gradients whose own backward raises.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

AttentionForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool],
                            tuple[torch.Tensor, torch.Tensor]]
AttentionBackward = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def forward_saving_lse(ctx, attention_forward: AttentionForward, q: torch.Tensor,
                       k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """o from `attention_forward(q, k, v, is_causal) -> (o, L)`, saving on `ctx` what
    `backward_from_saved` reads: L (the one tensor of shape (..., n_queries)), q, k, v, o."""
    o, lse = attention_forward(q, k, v, is_causal)
    ctx.save_for_backward(lse, q, k, v, o)
    ctx.is_causal = is_causal
    return o


def backward_from_saved(ctx, attention_backward: AttentionBackward, do: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
    """Gradients for forward's (q, k, v, is_causal) from
    `attention_backward(q, k, v, o, L, do, is_causal) -> (dq, dk, dv)`."""
    lse, q, k, v, o = ctx.saved_tensors
    return (*attention_backward(q, k, v, o, lse, do, ctx.is_causal), None)


def double_backward_refusal(name: str) -> bytes:
    return (f"{name} does not support double backward (second derivatives): its "
            "backward is not differentiable").encode()


def first_derivatives_only(message: bytes, backward: Callable[[], tuple],
                           sources: Callable[[], Sequence[object]]) -> tuple:
    """`backward()`, computed without recording a graph. When grad mode is on (inside a
    backward: create_graph=True), its tensors come back through a node that raises
    RuntimeError(`message`) when reached, fed by every tensor of `sources()` (what the
    gradients depend on; called only then, as it may unpack saved tensors) that requires
    grad: differentiating the gradients reaches it."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return backward()
    with torch.no_grad():
        outputs = backward()
    sources = [t for t in sources() if isinstance(t, torch.Tensor) and t.requires_grad]
    if not sources:
        return outputs
    refuse = torch._C._functions.DelayedError(message, len(outputs) + len(sources))
    return refuse(*outputs, *sources)[:len(outputs)]


def refuse_double_backward(name: str) -> Callable[[Callable], Callable]:
    """Decorate an autograd.Function's backward: differentiating its gradients raises a
    RuntimeError saying that `name` does not support double backward."""
    message = double_backward_refusal(name)

    def decorate(backward: Callable) -> Callable:
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            return first_derivatives_only(message, lambda: backward(ctx, *grads),
                                          lambda: (*ctx.saved_tensors, *grads))

        return wrapper

    return decorate
