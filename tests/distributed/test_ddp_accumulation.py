"""Gradient accumulation with `no_sync()`, a second backward without a sync, and ranks that
disagree on which parameters get gradients, for every data-parallel variant.

Each rank also holds an unwrapped float64 copy of the model and backpropagates the whole
global batch through it (the mean over ranks of each rank's summed microbatch losses): the
wrapped model's gradients must match it on every rank, so replicas cannot diverge.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from distributed_cases import SEQ, VOCAB, BranchToyModel, make_wrapper, params_of
from torch import nn

from systems.distributed.rank_pool import worker_state
from systems.model import cross_entropy

VARIANTS = [
    ("naive", {}), ("flat", {}), ("individual", {}),
    ("bucketed", {"bucket_size_mb": None}),
    # float64 ToyModel: 17.5 KB of gradients; this budget gives several multi-parameter
    # buckets, the branch's parameters sharing one with parameters every rank uses.
    ("bucketed", {"bucket_size_mb": 4096 / 2**20}),
]
VARIANT_IDS = ["naive", "flat", "individual", "bucketed", "bucketed_small"]

# Whether rank `rank` takes the model's branch in microbatch `m` of `n`.
BRANCH_SCHEDULES: dict[str, Callable[[int, int, int], bool]] = {
    "never": lambda rank, m, n: False,
    "every_rank_first_microbatch": lambda rank, m, n: m == 0,
    "rank0_last_microbatch": lambda rank, m, n: rank == 0 and m == n - 1,
    "rank0_first_microbatch": lambda rank, m, n: rank == 0 and m == 0,
}


def microbatch_loss(model: nn.Module, tokens: torch.Tensor, branch: bool) -> torch.Tensor:
    return cross_entropy(model(tokens[:, :-1], branch=branch), tokens[:, 1:])


def assert_grads_match(model: nn.Module, expected: dict[str, torch.Tensor | None],
                       what: str, zeros_for_none: bool = False) -> float:
    """Every gradient close to `expected` (float64); None where expected is None (or, with
    `zeros_for_none`, zeros)."""
    worst = 0.0
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        want = expected[name]
        if want is None:
            zeros = zeros_for_none and param.grad is not None and not param.grad.any()
            assert param.grad is None or zeros, f"{what}: {name} got a gradient"
            continue
        assert param.grad is not None, f"{what}: {name} has no gradient"
        torch.testing.assert_close(param.grad, want, rtol=1e-10, atol=1e-12,
                                   msg=lambda m, name=name: f"{what}: {name}: {m}")
        worst = max(worst, (param.grad - want).abs().max().item())
    return worst


def accumulate_and_compare(variant: str, options: dict, schedule: str, microbatches: int,
                           steps: int = 3) -> float:
    """Per step: microbatches - 1 backwards inside no_sync(), one outside, then sync; the
    gradients must equal the single-process gradients of the summed losses."""
    device = worker_state["device"]
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1000 * rank)  # differing inits: construction must broadcast
    model = BranchToyModel().double().to(device)
    wrapped = make_wrapper(variant, model, **options)
    reference = copy.deepcopy(model)
    takes_branch = BRANCH_SCHEDULES[schedule]
    generator = torch.Generator().manual_seed(7)
    worst = 0.0
    for step in range(steps):
        tokens = torch.randint(VOCAB, (world, microbatches, 2, SEQ + 1),
                               generator=generator).to(device)
        set_to_none = step < 2  # the third step accumulates into zeroed gradients
        wrapped.zero_grad(set_to_none=set_to_none)
        reference.zero_grad(set_to_none=set_to_none)
        total = sum(microbatch_loss(reference, tokens[r, m], takes_branch(r, m, microbatches))
                    for r in range(world) for m in range(microbatches))
        (total / world).backward()
        expected = {name: p.grad for name, p in reference.named_parameters()}

        for m in range(microbatches):
            last = m == microbatches - 1
            branch = takes_branch(rank, m, microbatches)
            with contextlib.nullcontext() if last else wrapped.no_sync():
                microbatch_loss(wrapped, tokens[rank, m], branch).backward()
            if m == 0 and not last:  # nothing communicated yet: this rank's own gradients
                named = [(n, p) for n, p in reference.named_parameters() if p.requires_grad]
                local = torch.autograd.grad(microbatch_loss(reference, tokens[rank, 0], branch),
                                            [p for _, p in named], allow_unused=True)
                own = {n: g for (n, _), g in zip(named, local, strict=True)}
                assert_grads_match(wrapped.module, own, f"step {step}, inside no_sync",
                                   zeros_for_none=True)  # zero_grad(set_to_none=False)
        wrapped.finish_gradient_synchronization()
        worst = max(worst, assert_grads_match(wrapped.module, expected, f"step {step}"))

        with torch.no_grad():  # the same plain SGD step on both models
            for net in (wrapped.module, reference):
                for param in net.parameters():
                    if param.grad is not None:
                        param -= 0.5 * param.grad
    return worst


@pytest.mark.parametrize("schedule", ["never", "every_rank_first_microbatch"])
@pytest.mark.parametrize(("variant", "options"), VARIANTS, ids=VARIANT_IDS)
def test_no_sync_accumulates(run_on_ranks, backend, variant, options, schedule):
    # "every_rank_first_microbatch": a parameter that gets its gradient only inside
    # no_sync() must still be synchronized by the backward outside it.
    results = run_on_ranks(accumulate_and_compare, variant, options, schedule, 3)
    assert len(results) == 2


@pytest.mark.parametrize(("schedule", "microbatches"), [
    ("rank0_last_microbatch", 1), ("rank0_last_microbatch", 2), ("rank0_first_microbatch", 2),
])
@pytest.mark.parametrize(("variant", "options"), VARIANTS, ids=VARIANT_IDS)
def test_ranks_that_disagree_on_used_parameters(run_on_ranks, backend, variant, options,
                                                schedule, microbatches):
    # Only rank 0 takes the branch: rank 1 contributes zeros to its gradients (as torch DDP
    # with find_unused_parameters does), and both ranks end with the same gradients.
    results = run_on_ranks(accumulate_and_compare, variant, options, schedule, microbatches)
    assert len(results) == 2


def second_backward(variant: str, options: dict, second_in_no_sync: bool) -> str | None:
    """Two backwards before one sync, the second plain or inside no_sync(): returns the
    error message (None if there was none); afterwards a normal step must work."""
    device = worker_state["device"]
    torch.manual_seed(0)
    wrapped = make_wrapper(variant, BranchToyModel().to(device), **options)
    tokens = torch.randint(VOCAB, (2, SEQ + 1), device=device)
    microbatch_loss(wrapped, tokens, branch=True).backward()
    message = None
    try:
        with wrapped.no_sync() if second_in_no_sync else contextlib.nullcontext():
            microbatch_loss(wrapped, tokens, branch=True).backward()
    except RuntimeError as error:
        message = str(error)
    wrapped.finish_gradient_synchronization()
    wrapped.zero_grad()
    microbatch_loss(wrapped, tokens, branch=True).backward()
    wrapped.finish_gradient_synchronization()
    return message


@pytest.mark.parametrize("second_in_no_sync", [False, True], ids=["plain", "in_no_sync"])
@pytest.mark.parametrize(("variant", "options"), VARIANTS, ids=VARIANT_IDS)
def test_second_backward_before_sync_raises(run_on_ranks, backend, variant, options,
                                            second_in_no_sync):
    messages = run_on_ranks(second_backward, variant, options, second_in_no_sync)
    for message in messages:
        assert message is not None, "a second backward before the sync went unnoticed"
        assert "no_sync()" in message and "finish_gradient_synchronization()" in message


def collectives_per_step(variant: str, options: dict) -> list[tuple[int, int]]:
    """(gradient all-reduces, other all-reduces) in each of two plain steps of ToyModel,
    whose `unused` layer no rank uses."""
    device = worker_state["device"]
    wrapped = make_wrapper(variant, BranchToyModel().to(device), **options)
    tokens = torch.randint(VOCAB, (2, SEQ + 1), device=device)
    calls: list[dist.ProcessGroup | None] = []
    original = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        calls.append(kwargs.get("group"))
        return original(tensor, *args, **kwargs)

    counts = []
    dist.all_reduce = counting_all_reduce
    try:
        for _ in range(2):
            calls.clear()
            wrapped.zero_grad()
            microbatch_loss(wrapped, tokens, branch=False).backward()
            wrapped.finish_gradient_synchronization()
            counts.append((calls.count(None), len(calls) - calls.count(None)))
    finally:
        dist.all_reduce = original
    return counts


@pytest.mark.parametrize(("variant", "options", "gradient_all_reduces"), [
    ("naive", {}, 6), ("flat", {}, 1), ("individual", {}, 6),
    ("bucketed", {"bucket_size_mb": None}, 1),
], ids=["naive", "flat", "individual", "bucketed"])
def test_one_usage_count_per_step_and_nothing_for_unused(run_on_ranks, backend, variant,
                                                          options, gradient_all_reduces):
    # Six of ToyModel's eight trainable tensors get gradients: a parameter no rank used
    # is not communicated, and the only extra collective is the usage count at the sync.
    counts = run_on_ranks(collectives_per_step, variant, options)
    assert counts == [[(gradient_all_reduces, 1)] * 2] * 2


def step_inside_no_sync(variant: str, options: dict) -> dict:
    """optimizer.step() inside no_sync(): the error; then the right loop must work and leave
    the replicas equal."""
    device = worker_state["device"]
    torch.manual_seed(dist.get_rank())  # different data on each rank
    wrapped = make_wrapper(variant, BranchToyModel().to(device), **options)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    unrelated = nn.Parameter(torch.ones(3, device=device))
    other_optimizer = torch.optim.SGD([unrelated], lr=0.1)
    tokens = torch.randint(VOCAB, (2, 2, SEQ + 1), device=device)
    message = None
    with wrapped.no_sync():
        microbatch_loss(wrapped, tokens[0], branch=False).backward()
        before = [p.detach().clone() for p in wrapped.parameters()]
        try:
            optimizer.step()
        except RuntimeError as error:
            message = str(error)
        unchanged = all(torch.equal(a, p) for a, p in zip(before, wrapped.parameters(),
                                                          strict=True))
        unrelated.grad = torch.ones_like(unrelated)
        other_optimizer.step()  # parameters of no wrapper: allowed
    microbatch_loss(wrapped, tokens[1], branch=False).backward()
    wrapped.finish_gradient_synchronization()
    optimizer.step()
    params = params_of(wrapped) if variant == "fsdp" else dict(wrapped.module.named_parameters())
    return {"message": message, "unchanged": unchanged,
            "params": {name: p.detach().cpu() for name, p in params.items()}}


@pytest.mark.parametrize(("variant", "options"), [*VARIANTS, ("fsdp", {})],
                         ids=[*VARIANT_IDS, "fsdp"])
def test_step_inside_no_sync_raises(run_on_ranks, backend, variant, options):
    # torch DDP lets each rank step on its own gradients and the replicas drift apart.
    results = run_on_ranks(step_inside_no_sync, variant, options)
    for result in results:
        message = result["message"]
        assert message is not None, "a step inside no_sync() went through"
        assert "no_sync()" in message and "finish_gradient_synchronization()" in message
        assert result["unchanged"], "the refused step changed parameters"
    for name, param in results[0]["params"].items():
        assert torch.equal(param, results[1]["params"][name]), f"{name}: replicas differ"
