"""MixedPrecisionAdamW: fp32 master weights updated like torch.optim.AdamW, bf16 copies,
the split master layout of bf16 parameters, and checkpoints."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from systems.kernel_runtime import interpreter
from systems.model.cuda_graph import CapturedStep
from systems.optim import MixedPrecisionAdamW
from systems.optim.adamw_kernel import BLOCK_SIZE, fused_adamw_step_, launch_fused_adamw_
from systems.optim.split_master import join_master, split_master

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
        if dtype == torch.bfloat16:  # the split layout: integer rounding, GPU and CPU alike
            assert torch.equal(p.detach(), split_master(master)[0])
        elif device == "cuda":
            assert torch.equal(p.detach(), master.to(dtype))
        else:  # Triton's interpreter truncates where the GPU rounds: within one unit
            error = (p.detach().float() - master).abs()
            assert torch.all(error <= torch.finfo(dtype).eps * master.abs())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,master_dtype", [
    (torch.bfloat16, torch.float32), (torch.bfloat16, torch.int16),
    (torch.float32, torch.float32)], ids=["bf16", "bf16-split", "fp32"])
def test_misaligned_tensors_update_exactly_like_aligned_ones(dtype, master_dtype, device):
    # Views one element into a buffer are not 16-byte aligned: the kernel must take its
    # element-wise path for them and still give the aligned result bit for bit.
    gen = torch.Generator().manual_seed(3)
    sizes = [2 * BLOCK_SIZE + 5, BLOCK_SIZE, 7]
    fresh = [[torch.randn(n, generator=gen).to(device) for n in sizes] for _ in range(5)]
    fresh[0] = [t.to(dtype) for t in fresh[0]]  # parameters
    fresh[1] = [t.to(dtype) for t in fresh[1]]  # gradients
    if master_dtype == torch.int16:  # low bits under the parameters
        fresh[2] = [split_master(t)[1] for t in fresh[2]]
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
    assert not torch.equal(aligned[0][0], fresh[0][0])  # the step did update


@pytest.mark.parametrize("device", DEVICES)
def test_split_masters_update_exactly_like_fp32_masters(device) -> None:
    """The kernel's split layout computes the fp32 layout's update bit for bit: its joined
    master equals the fp32 master, its parameter is that master's split, the moments agree.
    Sizes and masters cover several blocks, a ragged end, and values near rounding ties."""
    gen = torch.Generator().manual_seed(11)
    sizes = [BLOCK_SIZE + 3, 2 * BLOCK_SIZE, 5]
    masters = [torch.randn(n, generator=gen) for n in sizes]
    # Half-way patterns: the low 16 bits 0x8000 exactly, and one unit either side.
    masters[0][:3] = (masters[0][:3].view(torch.int32) & ~0xFFFF
                      | torch.tensor([0x7FFF, 0x8000, 0x8001], dtype=torch.int32)
                      ).view(torch.float32)
    masters = [m.to(device) for m in masters]
    grads = [torch.randn(n, generator=gen).to(device, torch.bfloat16) for n in sizes]
    moments = [[torch.randn(n, generator=gen).to(device).abs() for n in sizes]
               for _ in range(2)]
    split = [split_master(m) for m in masters]
    fp32 = ([p.clone() for p, _ in split], grads, [m.clone() for m in masters],
            *[[t.clone() for t in group] for group in moments])
    halves = ([p.clone() for p, _ in split], grads, [low.clone() for _, low in split],
              *[[t.clone() for t in group] for group in moments])
    # A step with no learning rate and no decay leaves the masters as they were, so the
    # kernel's split of them (ties included) must be PyTorch's.
    frozen = dict(lr=0.0, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0)
    still = [[t.clone() for t in group] for group in halves]
    fused_adamw_step_(*still, step=1, **frozen)
    assert all(torch.equal(a, p) for a, (p, _) in zip(still[0], split, strict=True))
    assert all(torch.equal(a, low) for a, (_, low) in zip(still[2], split, strict=True))
    hyper = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    for step in (1, 2, 3):
        fused_adamw_step_(*fp32, step=step, **hyper)
        fused_adamw_step_(*halves, step=step, **hyper)
    for i in range(len(sizes)):
        master = fp32[2][i]
        assert not torch.equal(master, masters[i])
        assert torch.equal(join_master(halves[0][i], halves[2][i]), master)
        assert torch.equal(halves[0][i], split_master(master)[0])
        assert torch.equal(halves[3][i], fp32[3][i]) and torch.equal(halves[4][i], fp32[4][i])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size,num_warps", [(1024, 4), (2048, 8)])
def test_every_tile_computes_the_same_bits(block_size, num_warps, device) -> None:
    """The kernel's tile is a tuning choice (studies/adamw_kernel_tune/study.py): another block
    size and warp count update the same tensors to the same bits as the default."""
    gen = torch.Generator().manual_seed(17)
    sizes = [3 * BLOCK_SIZE + 11, 2048, 7]
    masters = [torch.randn(n, generator=gen).to(device) for n in sizes]
    halves = [split_master(m) for m in masters]
    fresh = [[p for p, _ in halves], [torch.randn(n, generator=gen).to(device, torch.bfloat16)
                                      for n in sizes],
             [low for _, low in halves], [torch.randn(n, generator=gen).to(device) for n in sizes],
             [torch.rand(n, generator=gen).to(device) for n in sizes]]
    default = [[t.clone() for t in group] for group in fresh]
    tiled = [[t.clone() for t in group] for group in fresh]
    steps = torch.full((len(sizes),), 3.0, dtype=torch.float64, device=device)
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
    launch_fused_adamw_(*default, steps=steps, **hyper)
    launch_fused_adamw_(*tiled, steps=steps, block_size=block_size, num_warps=num_warps,
                        **hyper)
    for got, want in zip(tiled, default, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert not torch.equal(default[0][0], fresh[0][0])


_SPECIAL_FLOATS = [0.0, -0.0, float("inf"), float("-inf"), 3.4028234663852886e38, 1e-45,
                   -1e-45, 1.1754943508222875e-38]


@pytest.mark.parametrize("device", DEVICES)
def test_the_kernel_splits_special_values_as_pytorch_does(device) -> None:
    """A step without learning rate or decay leaves each master as it was and writes its
    split: zeros, infinities, the largest float (rounding to infinity, its low bits
    restoring it), subnormals, ties and NaNs of both signs, bit for bit as `split_master`."""
    specials = torch.tensor(_SPECIAL_FLOATS + [float("nan")], dtype=torch.float32)
    patterns = torch.tensor([0x3F808000, 0x3F818000, -0x40800000 - 0x8000, 0x7FFFFFFF, -1],
                            dtype=torch.int32).view(torch.float32)
    master = torch.cat([specials, patterns]).to(device)
    param, low = split_master(master)
    tensors = [[param.clone()], [torch.ones_like(param)], [low.clone()],
               [torch.zeros_like(master)], [torch.ones_like(master)]]
    fused_adamw_step_(*tensors, step=1, lr=0.0, beta1=0.9, beta2=0.999, eps=1e-8,
                      weight_decay=0.0)
    assert torch.equal(tensors[0][0].view(torch.int16), param.view(torch.int16))
    assert torch.equal(tensors[2][0], low)
    nan = torch.isnan(master)
    assert torch.isnan(tensors[0][0][nan]).all() and (tensors[2][0][nan] == 0).all()


@settings(max_examples=300, deadline=None)
@given(bits=st.integers(-2**31, 2**31 - 1))
@example(bits=0x3F808000)  # a tie between two bf16 neighbours, rounding up from an even one
@example(bits=0x3F818000)  # a tie above an odd one
@example(bits=0x7F7FFFFF)  # the largest fp32 rounds to bf16's infinity
@example(bits=0x7FFFFFFF)  # NaN, whose pattern would overflow the rounding
@example(bits=-1)  # a negative NaN, whose pattern would round to zero
def test_split_master_holds_every_fp32_pattern(bits: int) -> None:
    master = torch.tensor([bits], dtype=torch.int32).view(torch.float32)
    param, low = split_master(master)
    if torch.isnan(master).item():
        assert torch.isnan(param).item() and torch.isnan(join_master(param, low)).item()
        return
    assert torch.equal(join_master(param, low).view(torch.int32), master.view(torch.int32))
    if low.item() == -0x8000:  # a tie: away from zero, where round-to-even may go down
        assert abs(param.float().item()) >= abs(master.item())
    else:
        assert torch.equal(param, master.to(torch.bfloat16))


def test_split_master_at_special_values() -> None:
    master = torch.tensor(_SPECIAL_FLOATS, dtype=torch.float32)
    param, low = split_master(master)
    assert torch.equal(join_master(param, low).view(torch.int32), master.view(torch.int32))
    assert torch.equal(param, master.to(torch.bfloat16))
    with pytest.raises(ValueError, match="float32"):
        split_master(master.double())
    with pytest.raises(ValueError, match="int16"):
        join_master(param, low.int())


@pytest.mark.interpreter
def test_construction_casts_in_place_and_keeps_the_exact_fp32_values() -> None:
    params = _params(3, "cpu")
    originals = [p.detach().clone() for p in params]
    optimizer = MixedPrecisionAdamW(params)
    for p, original in zip(params, originals, strict=True):
        assert p.dtype == torch.bfloat16
        assert torch.equal(p.detach(), split_master(original)[0])
        assert torch.equal(optimizer.master(p), original)
        assert optimizer.state[p]["master_low_bits"].dtype == torch.int16
        assert "master" not in optimizer.state[p]


def _save_and_load(obj: object) -> object:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_a_checkpoint_resumes_bit_for_bit(dtype, device) -> None:
    """Three steps, a checkpoint of model and optimizer through torch.save, a fresh model
    and optimizer loaded from it, three more steps: the same parameters, masters and
    moments as six steps without the break. (torch's own load_state_dict would cast the
    fp32 state to the parameters' dtype.)"""
    kwargs = dict(lr=1e-2, weight_decay=0.1, compute_dtype=dtype)

    def steps(params, optimizer, gen, count):
        for _ in range(count):
            optimizer.zero_grad()
            _loss(params, gen).backward()
            optimizer.step()

    straight = _params(9, device)
    straight_optimizer = MixedPrecisionAdamW(straight, **kwargs)
    steps(straight, straight_optimizer, torch.Generator().manual_seed(10), 6)

    first = _params(9, device)
    first_optimizer = MixedPrecisionAdamW(first, **kwargs)
    gen = torch.Generator().manual_seed(10)
    steps(first, first_optimizer, gen, 3)
    saved = _save_and_load({"params": [p.detach() for p in first],
                            "optimizer": first_optimizer.state_dict()})
    resumed = _params(13, device)  # other values, overwritten by the checkpoint
    resumed_optimizer = MixedPrecisionAdamW(resumed, **kwargs)
    with torch.no_grad():
        for p, value in zip(resumed, saved["params"], strict=True):
            p.copy_(value)
    before = {(i, key): t for i, p in enumerate(resumed)
              for key, t in resumed_optimizer.state[p].items()}
    resumed_optimizer.load_state_dict(saved["optimizer"])
    # Loaded in place: a step captured in a CUDA graph reads the same tensors.
    assert all(resumed_optimizer.state[resumed[i]][key] is t for (i, key), t in before.items())
    steps(resumed, resumed_optimizer, gen, 3)

    for p, q in zip(straight, resumed, strict=True):
        assert torch.equal(p, q)
        assert torch.equal(straight_optimizer.master(p), resumed_optimizer.master(q))
        for key, value in straight_optimizer.state[p].items():
            assert value.dtype == resumed_optimizer.state[q][key].dtype, key
            assert torch.equal(value, resumed_optimizer.state[q][key]), key


@pytest.mark.gpu
def test_a_loaded_state_reaches_a_step_captured_in_a_cuda_graph() -> None:
    """Load an earlier checkpoint after capture: the replays must continue from it, as
    ordinary steps of a fresh optimizer loaded from it do (torch's load would have left the
    graph reading the replaced tensors)."""
    params = _params(15, "cuda")
    optimizer = MixedPrecisionAdamW(params, lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(16)
    for p in params:  # fixed gradients: the captured step reads these tensors
        p.grad = torch.randn(p.shape, generator=gen).to("cuda", torch.bfloat16)
    optimizer.step()
    earlier = _save_and_load({"params": [p.detach() for p in params],
                              "optimizer": optimizer.state_dict()})
    captured = CapturedStep(optimizer.step, warmup=1)
    for _ in range(3):
        captured()
    with torch.no_grad():
        for p, value in zip(params, earlier["params"], strict=True):
            p.copy_(value)
    optimizer.load_state_dict(earlier["optimizer"])
    for _ in range(2):
        captured()

    reference = [torch.nn.Parameter(value.to("cuda")) for value in earlier["params"]]
    reference_optimizer = MixedPrecisionAdamW(reference, lr=1e-2, weight_decay=0.1)
    reference_optimizer.load_state_dict(earlier["optimizer"])
    for p, r in zip(params, reference, strict=True):
        r.grad = p.grad.clone()
    for _ in range(2):
        reference_optimizer.step()
    torch.cuda.synchronize()
    for p, r in zip(params, reference, strict=True):
        assert torch.equal(p, r)
        assert torch.equal(optimizer.master(p), reference_optimizer.master(r))


@pytest.mark.interpreter
def test_a_parameter_the_checkpoint_has_no_state_for_keeps_its_own() -> None:
    params = _params(18, "cpu")
    optimizer = MixedPrecisionAdamW(params)
    saved = optimizer.state_dict()
    saved["state"] = {i: {key: t.clone() for key, t in state.items()}
                      for i, state in saved["state"].items() if i != 1}
    saved["state"][0]["exp_avg"].fill_(0.5)
    kept = {key: t.clone() for key, t in optimizer.state[params[1]].items()}
    optimizer.load_state_dict(saved)
    assert torch.all(optimizer.state[params[0]]["exp_avg"] == 0.5)
    assert all(torch.equal(optimizer.state[params[1]][key], t) for key, t in kept.items())
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()  # every parameter still has the state a step needs


@pytest.mark.interpreter
def test_a_checkpoint_of_another_layout_is_refused() -> None:
    bf16 = MixedPrecisionAdamW(_params(14, "cpu"))
    fp16 = MixedPrecisionAdamW(_params(14, "cpu"), compute_dtype=torch.float16)
    with pytest.raises(ValueError, match="does not fit"):
        fp16.load_state_dict(bf16.state_dict())
    saved = {**bf16.state_dict()}
    saved["state"] = {i: dict(state) for i, state in saved["state"].items()}
    saved["state"][0]["exp_avg"] = saved["state"][0]["exp_avg"].half()
    with pytest.raises(ValueError, match="saved exp_avg is torch.float16"):
        bf16.load_state_dict(saved)
    assert bf16.state[bf16.param_groups[0]["params"][0]]["exp_avg"].dtype == torch.float32


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
    monkeypatch.setattr(interpreter, "INTERPRETED", False)
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
