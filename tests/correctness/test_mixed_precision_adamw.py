"""MixedPrecisionAdamW: fp32 master weights updated like torch.optim.AdamW, bf16 copies."""

from __future__ import annotations

import pytest
import torch

from systems import triton_runtime
from systems.optim import MixedPrecisionAdamW
from systems.optim.adamw_kernel import BLOCK_SIZE, fused_adamw_step_

# One tensor over several kernel blocks with a ragged end, and small awkward ones.
SHAPES = [(3, BLOCK_SIZE + 17), (5,), (3, 4, 2), (1,)]
DEVICES = [pytest.param("cpu", marks=pytest.mark.interpreter),
           pytest.param("cuda", marks=pytest.mark.gpu)]


def _params(seed: int, device: str) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(device)) for s in SHAPES]


def _loss(params: list[torch.Tensor], gen: torch.Generator) -> torch.Tensor:
    # Gradients that change every step and are never zero.
    return sum(((p.float() - torch.randn(p.shape, generator=gen).to(p.device)) ** 3).sum()
               for p in params)


def _run(dtype: torch.dtype, device: str, steps: int, **kwargs):
    """Our optimizer on `dtype` parameters next to torch's AdamW fed the same gradients."""
    ours = _params(0, device)
    reference = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    optimizer = MixedPrecisionAdamW(ours, compute_dtype=dtype, **kwargs)
    torch_optimizer = torch.optim.AdamW(reference, foreach=False, **kwargs)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        optimizer.zero_grad()
        _loss(ours, gen).backward()
        for p, r in zip(ours, reference, strict=True):
            r.grad = p.grad.float()  # the same (low-precision) gradient, as fp32
        optimizer.step()
        torch_optimizer.step()
    return optimizer, ours, reference


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kwargs", [
    dict(lr=1e-3),
    dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
], ids=["defaults", "tuned"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_masters_follow_torch_adamw_and_params_are_their_rounding(dtype, kwargs, device):
    optimizer, ours, reference = _run(dtype, device, steps=50, **kwargs)
    for p, r in zip(ours, reference, strict=True):
        assert p.dtype == dtype
        master = optimizer.master(p)
        torch.testing.assert_close(master, r.detach(), rtol=1e-5, atol=1e-6)
        if device == "cuda":
            assert torch.equal(p.detach(), master.to(dtype))
        else:  # Triton's interpreter truncates where the GPU rounds: within one unit
            error = (p.detach().float() - master).abs()
            assert torch.all(error <= torch.finfo(dtype).eps * master.abs())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_misaligned_tensors_update_exactly_like_aligned_ones(dtype, device) -> None:
    # Views one element into a buffer are not 16-byte aligned: the kernel must take its
    # element-wise path for them and still give the aligned result bit for bit.
    gen = torch.Generator().manual_seed(3)
    sizes = [2 * BLOCK_SIZE + 5, BLOCK_SIZE, 7]
    fresh = [[torch.randn(n, generator=gen).to(device) for n in sizes] for _ in range(5)]
    fresh[0] = [t.to(dtype) for t in fresh[0]]  # parameters
    fresh[1] = [t.to(dtype) for t in fresh[1]]  # gradients
    fresh[4] = [t.abs() for t in fresh[4]]  # second moments are never negative

    def misaligned(t: torch.Tensor) -> torch.Tensor:
        view = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
        return view.copy_(t)

    aligned = [[t.clone() for t in group] for group in fresh]
    shifted = [[misaligned(t) for t in group] for group in fresh]
    assert all(t.data_ptr() % 16 for group in shifted for t in group)
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
    for step in (1, 2):
        fused_adamw_step_(*aligned, step=step, **hyper)
        fused_adamw_step_(*shifted, step=step, **hyper)
    for a_group, s_group in zip(aligned, shifted, strict=True):
        for a, s in zip(a_group, s_group, strict=True):
            assert torch.equal(a, s)
    assert not torch.equal(aligned[2][0], fresh[2][0].float())  # the step did update


@pytest.mark.interpreter
def test_construction_casts_in_place_and_keeps_the_exact_fp32_values() -> None:
    params = _params(3, "cpu")
    originals = [p.detach().clone() for p in params]
    optimizer = MixedPrecisionAdamW(params)
    for p, original in zip(params, originals, strict=True):
        assert p.dtype == torch.bfloat16
        assert torch.equal(p.detach(), original.to(torch.bfloat16))
        assert torch.equal(optimizer.master(p), original)


@pytest.mark.interpreter
def test_groups_added_later_start_their_own_step_count() -> None:
    first, second = _params(4, "cpu")[:2], _params(5, "cpu")[2:]
    ref_first = [torch.nn.Parameter(p.detach().clone()) for p in first]
    ref_second = [torch.nn.Parameter(p.detach().clone()) for p in second]
    ours = MixedPrecisionAdamW([{"params": first, "lr": 1e-2}], lr=1e-3)
    theirs = torch.optim.AdamW([{"params": ref_first, "lr": 1e-2}], lr=1e-3, foreach=False)
    gen = torch.Generator().manual_seed(6)
    for step in range(20):
        if step == 5:
            ours.add_param_group({"params": second, "weight_decay": 0.0})
            theirs.add_param_group({"params": ref_second, "weight_decay": 0.0})
        live = first + (second if step >= 5 else [])
        ref_live = ref_first + (ref_second if step >= 5 else [])
        ours.zero_grad()
        _loss(live, gen).backward()
        for p, r in zip(live, ref_live, strict=True):
            r.grad = p.grad.float()
        ours.step()
        theirs.step()
    for p, r in zip(first + second, ref_first + ref_second, strict=True):
        torch.testing.assert_close(ours.master(p), r.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.interpreter
def test_parameters_without_gradients_are_left_alone() -> None:
    params = _params(7, "cpu")
    optimizer = MixedPrecisionAdamW(params)
    before = [p.detach().clone() for p in params]
    params[0].grad = torch.ones_like(params[0])
    optimizer.step()
    assert not torch.equal(params[0].detach(), before[0])
    for p, b in zip(params[1:], before[1:], strict=True):
        assert torch.equal(p.detach(), b)
        assert optimizer.state[p]["step"] == 0


def test_cpu_tensors_need_the_interpreter(monkeypatch) -> None:
    monkeypatch.setattr(triton_runtime, "INTERPRETED", False)
    p, state = torch.randn(10), torch.zeros(10)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        fused_adamw_step_([p], [p], [state], [state], [state], step=1, lr=1e-3, beta1=0.9,
                          beta2=0.999, eps=1e-8, weight_decay=0.0)
    with pytest.raises(ValueError, match="needs CUDA parameters"):
        MixedPrecisionAdamW(_params(12, "cpu"))


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="floating"):
        MixedPrecisionAdamW(_params(8, "cpu"), compute_dtype=torch.int32)
    with pytest.raises(ValueError, match="contiguous"):
        MixedPrecisionAdamW([torch.nn.Parameter(torch.randn(4, 6).t())])
    p, state = torch.randn(10), torch.zeros(10)
    hyper = dict(step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    with pytest.raises(ValueError, match="float32"):
        fused_adamw_step_([p], [p], [state.double()], [state], [state], **hyper)
    with pytest.raises(ValueError, match="counts from 1"):
        fused_adamw_step_([p], [p], [state], [state], [state], **{**hyper, "step": 0})
    with pytest.raises(ValueError, match="shape"):
        fused_adamw_step_([p], [p[:5]], [state], [state], [state], **hyper)
    with pytest.raises(ValueError, match="1 master tensors for 2 parameters"):
        fused_adamw_step_([p, p], [p, p], [state], [state, state], [state, state], **hyper)
    with pytest.raises(ValueError, match="one parameter and one gradient dtype"):
        fused_adamw_step_([p, p.half()], [p, p.half()], [state] * 2, [state] * 2, [state] * 2,
                          **hyper)
