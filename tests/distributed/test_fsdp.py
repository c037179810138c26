"""FSDP against single-process training on the concatenated batch, and its units."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from distributed_cases import (
    MODELS,
    ExactStackModel,
    global_batches,
    loss_fn,
    tiny_lm,
    train_and_compare,
    vocab_of,
)

from systems.distributed import FSDP
from systems.distributed import fsdp as fsdp_module
from systems.distributed.rank_pool import worker_state
from systems.optim import AdamW

DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# Low-precision compute: the parameter updates must match fp32 training to within a few
# units of the compute dtype's rounding (fp16 has 11 significant bits, bf16 8).
TOLERANCE = {"fp32": {}, "fp16": {"update_rtol": 4e-3}, "bf16": {"update_rtol": 3e-2}}


@pytest.mark.parametrize("model_name", ["toy", "tiny_lm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_single_process(run_on_ranks, backend, dtype, model_name):
    results = run_on_ranks(train_and_compare, "fsdp", model_name, steps=3,
                           options={"compute_dtype": DTYPES[dtype]}, **TOLERANCE[dtype])
    assert all(r["compared"] > 0 for r in results)


# "exact" has one unit per module; "exact_stack" shards each block's three weights together.
@pytest.mark.parametrize("model_name", ["exact", "exact_stack"])
@pytest.mark.parametrize("trial", range(3))  # repeated with fresh seeds to catch races
def test_bitwise_equal_when_the_math_is_exact(run_on_ranks, backend, model_name, trial):
    results = run_on_ranks(train_and_compare, "fsdp", model_name, steps=1, exact=True,
                           seed=trial)
    assert all(r["compared"] > 0 for r in results)


def test_bitwise_equal_at_world_size_4(run_on_ranks, backend):
    # Four shards of each 377-element block unit: 95 elements each, the last padded by 3.
    results = run_on_ranks(train_and_compare, "fsdp", "exact_stack", world_size=4, steps=1,
                           exact=True, batch_per_rank=1)
    assert len(results) == 4


def unit_names(model_name: str) -> list[list[str]]:
    model = {"exact_stack": ExactStackModel, "tiny_lm": tiny_lm}[model_name]()
    wrapped = FSDP(model.to(worker_state["device"]))
    return [[slot.name for slot in unit.slots] for unit in wrapped._units]


def test_units_follow_module_list_elements(run_on_ranks):
    units = run_on_ranks(unit_names, "exact_stack")[0]
    # The frozen layer is a unit of its own; the tied head shares the embedding's unit.
    assert units == [["embed.weight"], ["frozen.weight"],
                     *([f"blocks.{i}.{name}.weight" for name in ("up", "mid", "down")]
                       for i in range(2))]
    units = run_on_ranks(unit_names, "tiny_lm")[0]
    assert [len(names) for names in units] == [1, 7, 7, 1]  # embedding, 2 blocks, LM head


def collectives_per_step(prefetch: int = 1) -> dict[str, int]:
    """All-gathers in forward and backward and reduce-scatters of one tiny_lm step (the
    second: the first has no recorded order to prefetch by)."""
    device = worker_state["device"]
    wrapped = FSDP(tiny_lm().to(device), prefetch=prefetch)
    tokens = torch.randint(512, (2, 16), device=device)
    counts = dict.fromkeys(("forward", "backward", "reduce_scatter"), 0)
    phase = "forward"
    gather, scatter = fsdp_module.all_gather_flat, fsdp_module.reduce_scatter_flat

    def counting_gather(*args, **kwargs):
        counts[phase] += 1
        return gather(*args, **kwargs)

    def counting_scatter(*args, **kwargs):
        counts["reduce_scatter"] += 1
        return scatter(*args, **kwargs)

    for step in range(2):
        if step == 1:
            fsdp_module.all_gather_flat = counting_gather
            fsdp_module.reduce_scatter_flat = counting_scatter
        try:
            phase = "forward"
            loss = wrapped(tokens).float().square().mean()
            phase = "backward"
            loss.backward()
            wrapped.finish_gradient_synchronization()
        finally:
            fsdp_module.all_gather_flat, fsdp_module.reduce_scatter_flat = gather, scatter
    return counts


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_one_collective_per_unit(run_on_ranks, prefetch):
    # 4 units (embedding, 2 blocks, LM head); backward re-gathers all but the embedding,
    # whose backward needs only the token ids. Gathering further ahead gathers nothing twice.
    assert run_on_ranks(collectives_per_step, prefetch) == [
        {"forward": 4, "backward": 3, "reduce_scatter": 4}] * 2


def trained_with_prefetch(model_name: str, prefetch: int, steps: int = 3) -> dict:
    """Full parameters after `steps` AdamW steps of FSDP gathering `prefetch` calls ahead
    (the first step gathers on demand: prefetching follows the previous step's order)."""
    device, world = worker_state["device"], dist.get_world_size()
    torch.manual_seed(0)
    wrapped = FSDP(MODELS[model_name]().to(device), prefetch=prefetch)
    optimizer = AdamW(wrapped.parameters(), lr=1e-2, weight_decay=0.1)
    mine = slice(2 * dist.get_rank(), 2 * dist.get_rank() + 2)
    for inputs, targets, weights in global_batches(vocab_of(wrapped.module), 2 * world, steps,
                                                   seed=0):
        optimizer.zero_grad(set_to_none=True)
        logits = wrapped(inputs[mine].to(device))
        loss_fn(model_name, logits, targets[mine].to(device), weights[mine].to(device)).backward()
        wrapped.finish_gradient_synchronization()
        optimizer.step()
    return wrapped.gather_full_params()


def same_bits_at_prefetch(model_name: str, prefetch: int) -> None:
    default, other = (trained_with_prefetch(model_name, p) for p in (1, prefetch))
    for name, tensor in default.items():
        assert torch.equal(other[name], tensor), f"{name}: not bitwise equal"


@pytest.mark.parametrize("prefetch", [0, 2, 3])
@pytest.mark.parametrize("model_name", ["exact_stack", "tiny_lm"])
def test_prefetch_depth_changes_no_bit(run_on_ranks, backend, model_name, prefetch):
    # Prefetching moves only when a gather is launched, never what is computed.
    run_on_ranks(same_bits_at_prefetch, model_name, prefetch)


def test_prefetch_two_ahead_matches_single_process(run_on_ranks, backend):
    results = run_on_ranks(train_and_compare, "fsdp", "tiny_lm", steps=3,
                           options={"prefetch": 2})
    assert all(r["compared"] > 0 for r in results)


def wrap_with_prefetch(prefetch: object) -> None:
    with pytest.raises(ValueError, match="prefetch"):
        FSDP(ExactStackModel().to(worker_state["device"]), prefetch=prefetch)


@pytest.mark.parametrize("prefetch", [-1, 1.5, True])
def test_rejects_a_prefetch_that_is_not_a_count(run_on_ranks, prefetch):
    run_on_ranks(wrap_with_prefetch, prefetch)


def wrap_with_compute_dtype(compute_dtype, error: type[Exception]) -> None:
    with pytest.raises(error, match="compute_dtype"):
        FSDP(ExactStackModel().to(worker_state["device"]), compute_dtype=compute_dtype)


@pytest.mark.parametrize(("compute_dtype", "error"), [
    (torch.int32, ValueError), (torch.bool, ValueError), (torch.complex64, ValueError),
    ("bfloat16", TypeError),
], ids=["int32", "bool", "complex64", "a string"])
def test_rejects_a_compute_dtype_that_is_not_floating(run_on_ranks, backend, compute_dtype,
                                                      error):
    # An integer compute dtype would truncate every weight in the all-gather.
    run_on_ranks(wrap_with_compute_dtype, compute_dtype, error)
