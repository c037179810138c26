"""BucketSteps (each bucket's or FSDP unit's optimizer step as soon as its reduction lands)
against the plain step after the sync: the same bits, whatever the buckets, accumulation or
ranks that disagree on used parameters."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.distributed as dist
from distributed_cases import MODELS, BranchToyModel, global_batches, loss_fn, vocab_of

from systems.distributed import FSDP, BucketSteps, DDPBucketed
from systems.distributed.rank_pool import worker_state
from systems.optim import AdamW

MODELS_HERE = {**MODELS, "branch": BranchToyModel}


def _trainable(net: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in net.parameters() if p.requires_grad]


def plain_and_bucket_steps(model_name: str, bucket_mb: float | None, *, steps: int = 3,
                           seed: int = 0, microbatches: int = 1, fsdp: bool = False) -> dict:
    """Train two copies of one model in DDPBucketed (or FSDP) with AdamW, one stepped after
    the sync, one by BucketSteps; assert bitwise equal parameters and optimizer state."""
    device = worker_state["device"]
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = MODELS_HERE[model_name]().to(device)
    wrap = FSDP if fsdp else lambda m: DDPBucketed(m, bucket_mb)
    twin = copy.deepcopy(model)  # before wrapping: FSDP takes the weights out of the model
    plain, early = wrap(model), wrap(twin)
    optimizers = [AdamW(_trainable(net), lr=1e-2, weight_decay=0.1) for net in (plain, early)]
    bucket_steps = BucketSteps(optimizers[1], early)
    landed = []
    for source in early.gradient_reductions():
        source.listeners.append(lambda params, work: landed.append(len(params)))
    kwargs = {"branch": rank == 0} if model_name == "branch" else {}
    batch = 2 * microbatches
    for inputs, targets, weights in global_batches(vocab_of(model), batch * world, steps, seed):
        mine = torch.arange(rank * batch, (rank + 1) * batch).to(device)
        inputs, targets, weights = inputs.to(device), targets.to(device), weights.to(device)
        for net, optimizer, step in ((plain, optimizers[0], optimizers[0].step),
                                     (early, optimizers[1], bucket_steps.step)):
            optimizer.zero_grad(set_to_none=True)
            for m, part in enumerate(mine.chunk(microbatches)):
                with net.no_sync() if m < microbatches - 1 else contextlib.nullcontext():
                    logits = net(inputs[part], **kwargs)
                    loss_fn(model_name, logits, targets[part], weights[part]).backward()
            net.finish_gradient_synchronization()
            step()
    for (name, want), got in zip(plain.named_parameters(), early.parameters(), strict=True):
        assert torch.equal(got, want), f"{name}: not bitwise equal"
    for want, got in zip(_trainable(plain), _trainable(early), strict=True):
        state_want, state_got = optimizers[0].state[want], optimizers[1].state[got]
        assert state_want.keys() == state_got.keys()
        assert all(torch.equal(torch.as_tensor(state_got[k]), torch.as_tensor(v))
                   for k, v in state_want.items())
    return {"landed": len(landed)}


@pytest.mark.parametrize("model_name", ["toy", "tiny_lm", "exact"])
@pytest.mark.parametrize("bucket_mb", [None, 2097 / 2**20, 0.1])
def test_same_bits_as_the_plain_step(run_on_ranks, backend, model_name, bucket_mb):
    results = run_on_ranks(plain_and_bucket_steps, model_name, bucket_mb)
    assert all(r["landed"] >= 3 for r in results)  # a bucket or more per step


@pytest.mark.parametrize("model_name", ["toy", "tiny_lm", "exact"])
def test_fsdp_same_bits_as_the_plain_step(run_on_ranks, backend, model_name):
    results = run_on_ranks(plain_and_bucket_steps, model_name, None, fsdp=True)
    assert all(r["landed"] >= 3 for r in results)  # a unit or more per step


@pytest.mark.parametrize("fsdp", [False, True], ids=["bucketed", "fsdp"])
def test_same_bits_with_accumulation(run_on_ranks, backend, fsdp):
    run_on_ranks(plain_and_bucket_steps, "toy", 2097 / 2**20, microbatches=2, fsdp=fsdp)


def test_same_bits_when_ranks_disagree_on_used_parameters(run_on_ranks, backend):
    run_on_ranks(plain_and_bucket_steps, "branch", 2097 / 2**20)


@pytest.mark.parametrize("fsdp", [False, True], ids=["bucketed", "fsdp"])
def test_same_bits_at_world_size_4(run_on_ranks, backend, fsdp):
    results = run_on_ranks(plain_and_bucket_steps, "tiny_lm", 0.1, world_size=4, fsdp=fsdp)
    assert len(results) == 4


def refusals() -> list[str]:
    model = MODELS["toy"]().to(worker_state["device"])
    ddp = DDPBucketed(model, None)
    errors = []
    try:
        BucketSteps(torch.optim.SGD(_trainable(ddp), lr=0.1), ddp)
    except TypeError as error:
        errors.append(str(error))
    steps = BucketSteps(AdamW(_trainable(ddp)), ddp)
    with ddp.no_sync():
        ddp(torch.randint(5, (2, 3), device=worker_state["device"])).sum().backward()
    try:
        steps.step()  # a no_sync() backward and no sync: each rank would step alone
    except RuntimeError as error:
        errors.append(str(error))
    return errors


def test_refuses_what_it_cannot_do(run_on_ranks):
    for errors in run_on_ranks(refusals):
        assert len(errors) == 2
        assert "step_parameters" in errors[0]
        assert "not averaged over ranks" in errors[1]
