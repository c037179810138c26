"""AdamW with decoupled weight decay and bias correction."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


class AdamW(torch.optim.Optimizer):
    """Loshchilov & Hutter's AdamW, matching `torch.optim.AdamW` step for step.

    Per step t:  p *= 1 - lr * wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
    p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps), in torch's order of operations
    so that rounding agrees too. Updates run as multi-tensor (foreach) kernels, one launch
    per operation instead of one per tensor.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - signature fixed by torch.optim.Optimizer
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group_of(group, group["params"])
        return loss

    @torch.no_grad()
    def step_parameters(self, params: Iterable[torch.Tensor]) -> None:
        """One step of only `params` (each in one of this optimizer's groups), as `step()`
        would take it: those without a gradient are skipped. For updates that run as
        soon as backward has produced some gradients (`systems.optim.OverlappedUpdates`)."""
        wanted = {id(p) for p in params}
        for group in self.param_groups:
            self._step_group_of(group, [p for p in group["params"] if id(p) in wanted])

    def _step_group_of(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        with_grads = [p for p in params if p.grad is not None]
        if with_grads:
            self._step_group(group, with_grads)

    def _step_group(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        lr, (beta1, beta2) = group["lr"], group["betas"]
        grads, exp_avgs, exp_avg_sqs = [], [], []
        for p in params:
            if p.grad.is_sparse:
                raise RuntimeError("AdamW does not support sparse gradients")
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
        # Parameters added to a group later have their own step counts: group by count.
        by_step: dict[int, list[int]] = {}
        for i, p in enumerate(params):
            by_step.setdefault(self.state[p]["step"], []).append(i)
        for step, idx in by_step.items():
            self._update(
                [params[i] for i in idx], [grads[i] for i in idx],
                [exp_avgs[i] for i in idx], [exp_avg_sqs[i] for i in idx],
                step, lr, beta1, beta2, group["eps"], group["weight_decay"],
            )

    @staticmethod
    def _update(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay):
        if weight_decay:
            torch._foreach_mul_(params, 1.0 - lr * weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - beta2)
        bias_correction1 = 1.0 - beta1**step
        bias_correction2_sqrt = math.sqrt(1.0 - beta2**step)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, -lr / bias_correction1)
