"""OverlappedUpdates: optimizer updates during backward give the bits of a plain step."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from systems.bench.workloads import build_recipe_workload
from systems.model import MODEL_CONFIGS, TransformerLM, cross_entropy
from systems.model.recipes import get_recipe
from systems.model.train_step import update_buckets
from systems.optim import AdamW, MixedPrecisionAdamW, OverlappedUpdates
from systems.optim.overlapped import SECOND_BACKWARD

TINY = MODEL_CONFIGS["tiny"]
DEVICES = [pytest.param("cpu", marks=pytest.mark.interpreter),
           pytest.param("cuda", marks=pytest.mark.gpu)]


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor | int]:
    return [t for group in optimizer.param_groups for p in group["params"]
            for t in optimizer.state[p].values()]


@pytest.mark.parametrize("device", DEVICES)
def test_overlapped_steps_equal_plain_steps_bit_for_bit(device: str) -> None:
    torch.manual_seed(0)
    with torch.device(device):
        plain_model = TransformerLM(TINY)
        overlapped_model = TransformerLM(TINY)
    overlapped_model.load_state_dict(plain_model.state_dict())
    plain = MixedPrecisionAdamW(plain_model.parameters(), lr=1e-2)
    overlapped = OverlappedUpdates(MixedPrecisionAdamW(overlapped_model.parameters(), lr=1e-2),
                                   update_buckets(overlapped_model))
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):  # fresh data each step: the moments and step counts move on
        tokens = torch.randint(TINY.vocab_size, (2, 2, 24), generator=gen).to(device)
        for model, optimizer in ((plain_model, plain), (overlapped_model, overlapped)):
            model.zero_grad(set_to_none=True)
            cross_entropy(model(tokens[0]), tokens[1]).backward()
            optimizer.step()
        for p, q in zip(plain_model.parameters(), overlapped_model.parameters(), strict=True):
            assert torch.equal(p, q)
        for s, t in zip(_state_tensors(plain), _state_tensors(overlapped.optimizer),
                        strict=True):
            assert torch.equal(s, t)


def _linears() -> tuple[torch.nn.Sequential, torch.nn.Parameter]:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)), \
        torch.nn.Parameter(torch.randn(4))


def test_a_bucket_is_updated_in_backward_once_all_its_gradients_arrived() -> None:
    model, unused = _linears()
    first, second = model
    updates = OverlappedUpdates(AdamW([*model.parameters(), unused], lr=0.1),
                                [list(second.parameters()), [*first.parameters(), unused]])
    before = [p.detach().clone() for p in (*model.parameters(), unused)]
    model(torch.randn(5, 8)).square().sum().backward()
    # The last layer's bucket is complete: updated before step(). The first layer's waits
    # for a gradient that never comes (`unused`), so step() updates what has one.
    assert not torch.equal(second.weight, before[2]) and not torch.equal(second.bias, before[3])
    assert torch.equal(first.weight, before[0]) and torch.equal(first.bias, before[1])
    updates.step()
    assert not torch.equal(first.weight, before[0]) and not torch.equal(first.bias, before[1])
    assert torch.equal(unused, before[4])


@settings(max_examples=40, deadline=None)
@given(layers_used=st.lists(st.booleans(), min_size=4, max_size=4).filter(any),
       bucket_of=st.lists(st.integers(-1, 2), min_size=8, max_size=8))
def test_any_buckets_and_any_unused_layers_give_the_plain_steps(layers_used, bucket_of
                                                                ) -> None:
    """Buckets drawn at random over the parameters (-1: in none), layers skipped by the
    forward at random (parameters without gradients): two overlapped steps leave every
    parameter and moment as two plain steps do."""
    torch.manual_seed(0)
    plain_model = torch.nn.ModuleList(torch.nn.Linear(6, 6) for _ in range(4))
    model = torch.nn.ModuleList(torch.nn.Linear(6, 6) for _ in range(4))
    model.load_state_dict(plain_model.state_dict())
    params = list(model.parameters())
    buckets = [[p for p, b in zip(params, bucket_of, strict=True) if b == number]
               for number in range(3)]
    plain = AdamW(plain_model.parameters(), lr=0.1)
    overlapped = OverlappedUpdates(AdamW(params, lr=0.1), buckets)
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        x = torch.randn(3, 6, generator=gen)
        for layers, optimizer in ((plain_model, plain), (model, overlapped)):
            layers.zero_grad(set_to_none=True)
            h = x
            for layer, used in zip(layers, layers_used, strict=True):
                h = layer(h).tanh() if used else h
            h.square().sum().backward()
            optimizer.step()
    for p, q in zip(plain_model.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)
    states = _state_tensors(plain), _state_tensors(overlapped.optimizer)
    assert states[0] and len(states[0]) == len(states[1])
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
               for a, b in zip(*states, strict=True))  # AdamW counts steps in ints


def test_parameters_in_no_bucket_are_updated_by_step() -> None:
    model, _ = _linears()
    first, second = model
    updates = OverlappedUpdates(AdamW(model.parameters(), lr=0.1), [list(second.parameters())])
    before = first.weight.detach().clone()
    model(torch.randn(5, 8)).square().sum().backward()
    assert torch.equal(first.weight, before)
    updates.step()
    assert not torch.equal(first.weight, before)


def test_a_second_backward_before_step_is_refused() -> None:
    model, _ = _linears()
    updates = OverlappedUpdates(AdamW(model.parameters()), [list(model.parameters())])
    model(torch.randn(5, 8)).sum().backward()
    with pytest.raises(RuntimeError, match="second gradient before step"):
        model(torch.randn(5, 8)).sum().backward()
    assert "gradient accumulation" in SECOND_BACKWARD
    updates.step()  # the step ends; the next one takes its backward again
    model.zero_grad()
    model(torch.randn(5, 8)).sum().backward()


def test_a_dropped_overlap_leaves_a_plain_optimizer() -> None:
    model, _ = _linears()
    OverlappedUpdates(AdamW(model.parameters(), lr=0.1), [list(model.parameters())])
    before = model[1].weight.detach().clone()
    for _ in range(2):
        model(torch.randn(5, 8)).sum().backward()
    assert torch.equal(model[1].weight, before)


def test_removed_hooks_leave_a_plain_optimizer() -> None:
    model, _ = _linears()
    updates = OverlappedUpdates(AdamW(model.parameters(), lr=0.1), [list(model.parameters())])
    updates.remove()
    before = model[1].weight.detach().clone()
    model(torch.randn(5, 8)).sum().backward()
    assert torch.equal(model[1].weight, before)


@pytest.mark.parametrize("buckets, message", [
    (lambda model, stranger: [[stranger]], "must be the optimizer's"),
    (lambda model, stranger: [[model[0].weight], [model[0].weight]], "one bucket only"),
])
def test_bad_buckets_are_refused(buckets, message: str) -> None:
    model, stranger = _linears()
    with pytest.raises(ValueError, match=message):
        OverlappedUpdates(AdamW(model.parameters()), buckets(model, stranger))


@pytest.mark.parametrize("overrides, message", [
    ({"optimizer": "torch_adamw"}, "needs optimizer='mixed_precision' or 'adamw'"),
    ({"compiled": True}, "needs compile_scope='blocks'"),
])
def test_the_step_option_refuses_what_cannot_overlap(overrides: dict, message: str) -> None:
    settings = {"attention": "reference", "compiled": False, "cuda_graph": False,
                "overlap_optimizer": True, **overrides}
    with pytest.raises(ValueError, match=message):
        build_recipe_workload(TINY, get_recipe("optimized", **settings), batch_size=1,
                              seq_len=8)


@pytest.mark.gpu
def test_a_graphed_compiled_step_with_overlapped_updates_equals_the_plain_one() -> None:
    """The recipe's step as the perf cases run it (blocks compiled, captured, replayed):
    the updates on the side stream give the parameters of the plain step, bit for bit."""
    models = []
    for overlap in (False, True):
        recipe = get_recipe("optimized", compile_scope="blocks", overlap_optimizer=overlap)
        workload = build_recipe_workload(TINY, recipe, batch_size=2, seq_len=64,
                                         device="cuda")
        for _ in range(5):  # warm-up, capture, replays
            workload.step()
        torch.cuda.synchronize()
        models.append(workload.model)
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(p, q)
