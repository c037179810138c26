"""Our AdamW against torch.optim.AdamW over many steps."""

from __future__ import annotations

import pytest
import torch

from systems.optim import AdamW


def _toy_params(seed: int) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2), (1,)]
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


def _run(optimizer_cls, steps: int, seed: int, **kwargs) -> list[torch.Tensor]:
    params = _toy_params(seed)
    optimizer = optimizer_cls(params, **kwargs)
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        optimizer.zero_grad()
        # A loss whose gradients change every step and are never zero.
        loss = sum(((p - torch.randn(p.shape, generator=gen)) ** 2).sum() for p in params)
        loss.backward()
        optimizer.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr=1e-3),
        dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
        dict(lr=1e-2, weight_decay=0.0),
    ],
)
def test_matches_torch_adamw_over_many_steps(kwargs) -> None:
    ours = _run(AdamW, steps=200, seed=0, **kwargs)
    theirs = _run(torch.optim.AdamW, steps=200, seed=0, foreach=False, **kwargs)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_param_groups_and_late_added_groups_follow_torch() -> None:
    def run(cls, **extra):
        first, second = _toy_params(1)[:2], _toy_params(2)[2:]
        opt = cls([{"params": first, "lr": 1e-2}], lr=1e-3, weight_decay=0.05, **extra)
        for step in range(30):
            if step == 10:
                opt.add_param_group({"params": second, "weight_decay": 0.0})
            opt.zero_grad()
            live = first + (second if step >= 10 else [])
            sum((p**3).sum() for p in live).backward()
            opt.step()
        return [p.detach().clone() for p in first + second]

    for a, b in zip(run(AdamW), run(torch.optim.AdamW, foreach=False), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_parameters_without_gradients_are_untouched() -> None:
    used, unused = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
    before = unused.detach().clone()
    opt = AdamW([used, unused], lr=0.1, weight_decay=0.5)
    (used**2).sum().backward()
    opt.step()
    assert torch.equal(unused, before)
    assert unused not in opt.state or not opt.state[unused]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(lr=-1.0), "lr"), (dict(betas=(0.9, 1.0)), "betas"), (dict(eps=-1e-8), "eps"),
     (dict(weight_decay=-0.1), "weight_decay")],
)
def test_bad_hyperparameters_are_rejected(kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdamW([torch.nn.Parameter(torch.randn(2))], **kwargs)
