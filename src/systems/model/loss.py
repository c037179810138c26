"""Cross-entropy over the vocabulary, computed in fp32 for stability, plain and fused with
the LM head.

The fused path: LM head + cross-entropy, chunked over tokens so the full logits never
exist at once.

The plain path materialises (tokens x vocab) logits, their fp32 copy for the loss and the
same-sized gradient. Here each chunk of tokens computes its logits in the compute dtype,
the log-sum-exp and softmax in fp32, and right away the chunk's gradients with respect to
the hidden states and the head weight; only those gradients are kept for backward.

Why gradients in forward rather than recomputing logits in backward: a training step needs
both anyway, and this way the head costs three matmuls (logits, dX, dW) like the plain
path, where recomputation would cost four. What stays alive until backward is dX
(tokens x d_model) and dW (vocab x d_model, fp32), never a tokens x vocab tensor. The price:
the loss is once-differentiable, and a forward whose loss is never backpropagated pays for
the gradient matmuls (`linear_cross_entropy` skips them when no input requires grad).
"""

from __future__ import annotations

import torch


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over all positions of -log softmax(logits)[target].

    logits: (..., vocab), targets: (...) integer class indices.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not match"
        )
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # never below fp32
    target_logits = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (torch.logsumexp(logits, dim=-1) - target_logits).mean()


DEFAULT_CHUNK_TOKENS = 2048


def _stats_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    # Softmax statistics, the loss and the weight gradient: fp32, or fp64 for fp64 inputs.
    return torch.promote_types(compute_dtype, torch.float32)


class LinearCrossEntropy(torch.autograd.Function):
    """`LinearCrossEntropy.apply(x, weight, targets, compute_dtype, chunk_tokens)` is
    `cross_entropy(x @ weight.T, targets)` (mean over tokens) in chunks of tokens.

    x: (tokens, d) hidden states, weight: (vocab, d), targets: (tokens,) class indices.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                compute_dtype: torch.dtype, chunk_tokens: int) -> torch.Tensor:
        tokens, stats_dtype = x.shape[0], _stats_dtype(compute_dtype)
        w = weight.to(compute_dtype)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_x = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight, dtype=stats_dtype) if ctx.needs_input_grad[1] \
            else None
        loss = torch.zeros((), dtype=stats_dtype, device=x.device)
        for start in range(0, tokens, chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            x_c, t_c = x[rows].to(compute_dtype), targets[rows]
            # Matmul in the compute dtype (bf16 on tensor cores), statistics in fp32.
            logits = (x_c @ w.T).to(stats_dtype)
            lse = torch.logsumexp(logits, dim=-1)
            loss += (lse - logits.gather(-1, t_c[:, None]).squeeze(-1)).sum()
            if not needs_grad:
                continue
            # d(mean loss)/d(logits) = (softmax - onehot) / tokens, built in place.
            grad_logits = logits.sub_(lse[:, None]).exp_()
            grad_logits.scatter_add_(-1, t_c[:, None], grad_logits.new_full((len(t_c), 1), -1.0))
            grad_logits = grad_logits.div_(tokens).to(compute_dtype)
            if grad_x is not None:
                grad_x[rows] = grad_logits @ w
            if grad_w is not None:
                grad_w += (grad_logits.T @ x_c).to(stats_dtype)
        ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = weight.dtype
        return loss / tokens

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: torch.Tensor):
        grad_x, grad_w = ctx.saved_tensors
        weight_grad = None if grad_w is None else (grad_w * grad_loss).to(ctx.weight_dtype)
        return (None if grad_x is None else grad_x * grad_loss.to(grad_x.dtype),
                weight_grad, None, None, None)


def linear_cross_entropy(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Mean cross-entropy of `x @ weight.T` against `targets` without full logits.

    x: (..., d), weight: (vocab, d), targets: (...). Under autocast the matmuls run in the
    autocast dtype, otherwise in x's dtype; log-sum-exp and the loss are fp32.
    """
    if x.shape[:-1] != targets.shape:
        raise ValueError(f"x {tuple(x.shape)} and targets {tuple(targets.shape)} do not match")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    device_type = x.device.type
    compute_dtype = (torch.get_autocast_dtype(device_type)
                     if torch.is_autocast_enabled(device_type) else x.dtype)
    # The Function casts explicitly; autocast inside it would cast a second time.
    with torch.autocast(device_type, enabled=False):
        return LinearCrossEntropy.apply(x.reshape(-1, x.shape[-1]), weight,
                                        targets.reshape(-1), compute_dtype, chunk_tokens)
