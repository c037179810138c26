"""Refusing second derivatives with a clear error instead of a wrong answer.

The flash backward passes recompute attention from L, which autograd sees as a constant:
differentiating their gradients again would silently drop L's dependence on q and k. So a
backward wrapped here computes its gradients without recording a graph, and when asked to
(`create_graph=True`) hands back gradients whose own backward raises.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def refuse_double_backward(name: str) -> Callable[[Callable], Callable]:
    """Decorate an autograd.Function's backward: differentiating its gradients raises a
    RuntimeError saying that `name` does not support double backward."""
    message = (f"{name} does not support double backward (second derivatives): its "
               "backward is not differentiable").encode()

    def decorate(backward: Callable) -> Callable:
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            if not torch.is_grad_enabled() or torch.compiler.is_compiling():
                return backward(ctx, *grads)
            # Grad mode on inside backward means create_graph=True.
            with torch.no_grad():
                outputs = backward(ctx, *grads)
            # A node that raises when reached, fed by everything the gradients depend on:
            # differentiating them with respect to any of those reaches it.
            sources = [t for t in (*ctx.saved_tensors, *grads)
                       if isinstance(t, torch.Tensor) and t.requires_grad]
            if not sources:
                return outputs
            refuse = torch._C._functions.DelayedError(message, len(outputs) + len(sources))
            return refuse(*outputs, *sources)[:len(outputs)]

        return wrapper

    return decorate
