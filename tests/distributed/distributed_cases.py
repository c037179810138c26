"""Models, data and the rank-side training comparison shared by the distributed tests.

Every rank trains the wrapped model on its slice of each global batch and, alongside, an
unwrapped copy on the whole global batch (the single-process reference); the parameters
must match after every run. Functions here run inside rank processes.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from systems.distributed import FSDP, DDPBucketed, DDPIndividualParameters, FlatDDP, NaiveDDP
from systems.distributed.rank_pool import worker_state
from systems.model import MODEL_CONFIGS, TransformerLM, cross_entropy
from systems.optim import AdamW, ShardedOptimizer

VOCAB, SEQ = 37, 6


class ToyModel(nn.Module):
    """Embedding tied to the output head, a frozen layer, a layer that never gets a
    gradient, biases and norm gains (1-D), and sizes that no world size divides."""

    def __init__(self, vocab: int = VOCAB, d_model: int = 13, hidden: int = 29) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.frozen = nn.Linear(d_model, d_model)
        self.frozen.requires_grad_(False)
        self.up = nn.Linear(d_model, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.unused = nn.Linear(hidden, hidden)
        self.down = nn.Linear(hidden, d_model, bias=False)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.frozen(self.embed(tokens)))
        x = self.down(torch.relu(self.norm(self.up(x))))
        return self.head(x)


class BranchToyModel(ToyModel):
    """ToyModel whose `unused` layer is a residual branch taken only when asked: ranks
    that pass different `branch` flags disagree on which parameters get gradients."""

    def forward(self, tokens: torch.Tensor, branch: bool = False) -> torch.Tensor:
        x = torch.relu(self.frozen(self.embed(tokens)))
        x = torch.relu(self.norm(self.up(x)))
        if branch:
            x = x + torch.relu(self.unused(x))
        return self.head(self.down(x))


def dyadic_(model: nn.Module) -> None:
    """Set every parameter to small dyadic values (k/4, |k| <= 2), in place: with the loss
    linear in the logits (see loss_fn) the models below get exact fp32 gradients, so any
    reduction order gives the same bits."""
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randint(-2, 3, param.shape) / 4)


class ExactToyModel(ToyModel):
    """ToyModel without the norm, with dyadic values (see dyadic_)."""

    def __init__(self) -> None:
        super().__init__(vocab=16, d_model=8, hidden=12)
        self.norm = nn.Identity()
        dyadic_(self)


class Block(nn.Module):
    """Residual ReLU MLP with three 2-D weights of odd total size (with two ranks, a shard
    boundary falls inside `mid` and the last shard is padded) and a bias."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, hidden)
        self.mid = nn.Linear(hidden, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.mid(torch.relu(self.up(x)))))


class ExactStackModel(nn.Module):
    """Blocks in a ModuleList (FSDP shards each block's weights as one unit) between a
    frozen layer and an output head tied to the embedding; dyadic values (see dyadic_)."""

    def __init__(self, vocab: int = 16, d_model: int = 8, hidden: int = 13) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.frozen = nn.Linear(d_model, d_model)
        self.frozen.requires_grad_(False)
        self.blocks = nn.ModuleList(Block(d_model, hidden) for _ in range(2))
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.embed.weight
        dyadic_(self)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.frozen(self.embed(tokens)))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def tiny_lm() -> nn.Module:
    return TransformerLM(MODEL_CONFIGS["tiny"])


MODELS: dict[str, Callable[[], nn.Module]] = {
    "toy": ToyModel, "exact": ExactToyModel, "exact_stack": ExactStackModel, "tiny_lm": tiny_lm,
}


def make_wrapper(variant: str, model: nn.Module, **options) -> nn.Module:
    wrappers: dict[str, Callable[..., nn.Module]] = {
        "naive": NaiveDDP, "flat": FlatDDP, "individual": DDPIndividualParameters,
        "bucketed": DDPBucketed, "fsdp": FSDP,
    }
    return wrappers[variant](model, **options)


def vocab_of(model: nn.Module) -> int:
    if isinstance(model, TransformerLM):
        return model.config.vocab_size
    return model.embed.num_embeddings


def loss_fn(model_name: str, logits: torch.Tensor, targets: torch.Tensor,
            weights: torch.Tensor) -> torch.Tensor:
    if model_name.startswith("exact"):  # linear in the logits: exact gradients (see dyadic_)
        return (logits.float() * weights).sum() / targets.shape[0]  # power-of-2 batches
    return cross_entropy(logits, targets)


def global_batches(vocab: int, batch: int, steps: int, seed: int):
    """Shuffled draws from a fixed random data set, the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(vocab, (4 * batch, SEQ + 1), generator=generator)
    weights = torch.randint(-4, 5, (4 * batch, SEQ, vocab), generator=generator) / 4
    for _ in range(steps):
        order = torch.randperm(len(data), generator=generator)[:batch]
        yield data[order, :-1], data[order, 1:], weights[order]


def params_of(wrapped: nn.Module) -> dict[str, torch.Tensor]:
    if isinstance(wrapped, FSDP):
        return wrapped.gather_full_params()
    return {name: p.detach() for name, p in wrapped.module.named_parameters()}


def train_and_compare(variant: str, model_name: str, *, options: dict | None = None,
                      steps: int = 3, batch_per_rank: int = 2, seed: int = 0,
                      lr: float = 1e-2, exact: bool = False, rtol: float = 1e-5,
                      atol: float = 1e-6, sharded_optimizer: bool = False,
                      update_rtol: float | None = None, microbatches: int = 1,
                      sync_last: bool = True) -> dict:
    """Train wrapped and reference models side by side; assert equal parameters.

    Inexact (random-data) runs use SGD with momentum, whose update is proportional to the
    gradients, so reduction-order rounding (~1e-7 relative) stays that small; AdamW would
    turn rounding noise in a near-zero gradient into a full step of size lr. Exact runs use
    AdamW: with bit-identical gradients its update must be bit-identical too. With
    `update_rtol` (low-precision compute) each parameter's total change must match the
    reference's to that relative error in norm. With `microbatches` > 1 each rank splits its
    slice and runs the backwards of all but the last (with `sync_last` False, of all)
    inside no_sync().

    Returns what the parent test checks as well: bucket count and the largest difference.
    """
    device = worker_state["device"]
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed + 1000 * rank)  # differing inits: construction must broadcast
    model = MODELS[model_name]().to(device)
    wrapped = make_wrapper(variant, model, **(options or {}))
    reference = copy.deepcopy(model) if variant != "fsdp" else None
    if reference is None:  # FSDP took the module's weights: rebuild from the gathered ones
        torch.manual_seed(seed)
        reference = MODELS[model_name]().to(device)
        full = wrapped.gather_full_params()
        with torch.no_grad():
            for name, param in reference.named_parameters():
                param.copy_(full[name])
    initial = {name: p.detach().clone() for name, p in reference.named_parameters()}
    optimizer_cls, hyper = ((AdamW, {"lr": lr, "weight_decay": 0.1}) if exact
                            else (torch.optim.SGD, {"lr": 10 * lr, "momentum": 0.9}))
    make_optimizer = functools.partial(optimizer_cls, **hyper)
    params = [p for p in wrapped.parameters() if p.requires_grad]
    optimizer = (ShardedOptimizer(params, optimizer_cls, **hyper)
                 if sharded_optimizer else make_optimizer(params))
    ref_optimizer = make_optimizer([p for p in reference.parameters() if p.requires_grad])
    for inputs, targets, weights in global_batches(vocab_of(model), batch_per_rank * world,
                                                   steps, seed):
        inputs, targets, weights = inputs.to(device), targets.to(device), weights.to(device)
        ref_optimizer.zero_grad(set_to_none=True)
        loss_fn(model_name, reference(inputs), targets, weights).backward()
        ref_optimizer.step()
        mine = slice(rank * batch_per_rank, (rank + 1) * batch_per_rank)
        optimizer.zero_grad(set_to_none=True)
        for m, part in enumerate(torch.arange(mine.start, mine.stop).chunk(microbatches)):
            inside = m < microbatches - 1 or not sync_last
            with wrapped.no_sync() if inside else contextlib.nullcontext():
                loss = loss_fn(model_name, wrapped(inputs[part]), targets[part], weights[part])
                (loss / microbatches).backward()  # powers of 2: exact
        wrapped.finish_gradient_synchronization()
        optimizer.step()
    got, want = params_of(wrapped), dict(reference.named_parameters())
    assert got.keys() == want.keys(), (sorted(got), sorted(want))
    worst = 0.0
    for name, expected in want.items():
        actual = got[name].to(expected.dtype)
        if exact:
            assert torch.equal(actual, expected), f"{name}: not bitwise equal"
        elif update_rtol is not None:
            want_step, got_step = expected - initial[name], actual - initial[name]
            error = (got_step - want_step).norm() / want_step.norm().clamp_min(1e-30)
            assert error <= update_rtol, f"{name}: update off by {error:.2e} relative"
        else:
            torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol,
                                       msg=lambda m, name=name: f"{name}: {m}")
        worst = max(worst, (actual - expected).abs().max().item())
    buckets = getattr(getattr(wrapped, "grad_sync", None), "buckets", [])
    return {"compared": len(want), "max_abs_diff": worst, "buckets": len(buckets)}

