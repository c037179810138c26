"""Training recipes: the optimised step computes what the plain one does."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from systems import accounting as acc
from systems.attention.registry import saves_scores
from systems.bench.checkpoint_fit import (
    BUDGET_SHARE,
    Fit,
    PeakModel,
    cached_peak_model,
    fit_to_device,
    measure_peak_model,
    step_peak,
)
from systems.bench.workloads import build_recipe_workload
from systems.model import MODEL_CONFIGS, TransformerLM, cross_entropy
from systems.model.recipes import RECIPES, get_recipe, runnable_on
from systems.model.train_step import CUDA_GRAPH_WARMUP, StepOptions
from systems.optim.names import torch_adamw_settings
from systems.profiling.memory import saved_tensor_bytes

TINY = MODEL_CONFIGS["tiny"]


def _one_step(name: str, device, config=TINY, **overrides) -> tuple[float, list[torch.Tensor]]:
    """Loss and gradients of one train step (the gradients are those of the initial weights,
    the same for every recipe with the same seed), and the dtype each gradient was kept in."""
    workload = build_recipe_workload(config, get_recipe(name, **overrides), batch_size=2,
                                     seq_len=48, device=device)
    loss = workload.step().item()
    grads = [p.grad for p in workload.model.parameters()]
    return loss, [g.float() for g in grads], [g.dtype for g in grads]


def _max_errors(got, expected) -> list[float]:
    loss, grads, _ = got
    ref_loss, ref_grads, _ = expected
    return [abs(loss - ref_loss), *((g - r).abs().max().item()
                                    for g, r in zip(grads, ref_grads, strict=True))]


def _assert_as_close_as_plain(got, exact, plain_errors: list[float], slack: float) -> None:
    """Each error of `got` against `exact` is at most twice the plain bf16 step's, plus one
    unit in the last place of the dtype `got` kept the gradient in (bf16 parameters have
    bf16 gradients: storing them costs that rounding, on top of computing them)."""
    rounding = [0.0] + [torch.finfo(dtype).eps * r.abs().max().item()
                        for dtype, r in zip(got[2], exact[1], strict=True)]
    for error, reference, ulp in zip(_max_errors(got, exact), plain_errors, rounding,
                                     strict=True):
        assert error <= 2 * reference + ulp + slack


def _assert_close(got, expected, tol: float) -> None:
    assert max(_max_errors(got, expected)) <= tol


def test_pytorch_baseline_is_pytorch_at_its_best() -> None:
    recipe = RECIPES["pytorch_baseline"]
    assert (recipe.attention, recipe.precision, recipe.compiled) == ("sdpa", "bf16", True)
    assert recipe.options == StepOptions(optimizer="torch_adamw", cuda_graph=True)
    assert recipe.options.compile_scope == "model"  # the whole model, as ours
    # Under the graph, torch's AdamW is one fused kernel that counts steps on the device.
    assert torch_adamw_settings(torch.device("cuda"), cuda_graph=True) == {
        "fused": True, "foreach": False, "capturable": True}
    assert torch_adamw_settings(torch.device("cuda"), cuda_graph=False)["fused"]
    assert torch_adamw_settings(torch.device("cpu"), cuda_graph=False) == {
        "fused": False, "foreach": True, "capturable": False}


@pytest.mark.parametrize("name", ["pytorch_baseline", "optimized"])
def test_graphed_recipes_need_cuda_and_turn_the_graph_off_elsewhere(name: str) -> None:
    recipe = get_recipe(name)
    assert recipe.options.cuda_graph
    with pytest.raises(ValueError, match="needs a CUDA device"):
        build_recipe_workload(TINY, recipe, seq_len=16, device="cpu")
    on_cpu = runnable_on(recipe, "cpu")
    assert on_cpu == get_recipe(name, cuda_graph=False)
    assert runnable_on(recipe, "cuda") == recipe
    assert runnable_on(RECIPES["eager"], "cpu") == RECIPES["eager"]


def test_torch_adamw_of_the_baseline_trains_like_ours_in_fp32() -> None:
    """The baseline's optimizer (torch's, multi-tensor off CUDA) and the plain step's (ours)
    take the same steps: 20 steps in fp32 agree to float rounding."""
    losses = {}
    for name in ("eager", "pytorch_baseline"):
        workload = build_recipe_workload(
            TINY, get_recipe(name, precision="fp32", compiled=False, cuda_graph=False,
                             attention="reference", lr=1e-3),
            batch_size=2, seq_len=24)
        losses[name] = torch.tensor([workload.step().item() for _ in range(20)])
    assert losses["eager"][-1] < losses["eager"][0] - 0.5
    torch.testing.assert_close(losses["pytorch_baseline"], losses["eager"], rtol=1e-5, atol=0)


def test_load_batch_feeds_the_next_step_and_checks_its_input() -> None:
    workload = build_recipe_workload(TINY, get_recipe("eager", precision="fp32"),
                                     batch_size=2, seq_len=16, seed=3)
    tokens, targets = torch.randint(TINY.vocab_size, (2, 2, 16),
                                    generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        expected = cross_entropy(workload.model(tokens), targets).item()
    workload.load_batch(tokens, targets)
    assert workload.step().item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="shape"):
        workload.load_batch(tokens[:, :8], targets)
    with pytest.raises(ValueError, match="int64"):
        workload.load_batch(tokens, targets.float())


@pytest.mark.parametrize("overrides", [
    {"compiled": False},
    {"compiled": False, "checkpoint_every": 1},
    pytest.param({}, marks=pytest.mark.slow, id="compiled"),  # the one CPU compile (~15 s)
], ids=["eager", "checkpointed", "compiled"])
@pytest.mark.interpreter
def test_optimized_matches_plain_in_fp32(overrides) -> None:
    device = torch.device("cpu")
    plain = _one_step("eager", device, precision="fp32")
    _assert_close(_one_step("optimized", device, precision="fp32", cuda_graph=False,
                            **overrides), plain, 1e-4)


@pytest.mark.interpreter
def test_bf16_optimized_is_as_close_to_fp32_as_the_plain_bf16_step() -> None:
    # Triton's interpreter cannot run bf16 dots: SDPA stands in for the flash kernels here;
    # the GPU test below runs the real recipe.
    device = torch.device("cpu")
    exact = _one_step("eager", device, precision="fp32")
    plain = _max_errors(_one_step("eager", device), exact)
    fused = _one_step("optimized", device, attention="sdpa", compiled=False, cuda_graph=False)
    _assert_as_close_as_plain(fused, exact, plain, slack=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["pytorch_baseline", "optimized"])
def test_recipe_on_gpu_is_as_close_to_fp32_as_the_plain_bf16_step(name: str) -> None:
    device = torch.device("cuda")
    config = TINY.with_overrides(d_model=256, num_heads=4, d_ff=512)  # head dim 64
    exact = _one_step("eager", device, config, precision="fp32")
    plain = _max_errors(_one_step("eager", device, config), exact)
    _assert_as_close_as_plain(_one_step(name, device, config), exact, plain, slack=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["pytorch_baseline", "optimized"])
def test_cuda_graph_replays_compute_what_ordinary_steps_do(name: str) -> None:
    """Steps replayed from the captured graph follow the same trajectory as ordinary steps:
    a step count or bias correction frozen at capture would move the weights differently."""
    config = TINY.with_overrides(d_model=256, num_heads=4, d_ff=512)
    runs = {}
    for graphed in (False, True):
        workload = build_recipe_workload(config, get_recipe(name, cuda_graph=graphed),
                                         batch_size=2, seq_len=64, device="cuda")
        losses = torch.stack([workload.step().clone() for _ in range(CUDA_GRAPH_WARMUP + 4)])
        params = [p.detach().clone() for p in workload.model.parameters()]
        runs[graphed] = (losses, params)
        if graphed:
            assert workload.step.graph is not None
    (plain_losses, plain_params), (graph_losses, graph_params) = runs[False], runs[True]
    assert plain_losses[-1] < plain_losses[0]
    torch.testing.assert_close(graph_losses, plain_losses, rtol=1e-3, atol=0)
    for got, expected in zip(graph_params, plain_params, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_cuda_graph_needs_a_capturable_optimizer() -> None:
    with pytest.raises(ValueError, match="counts steps on the GPU"):
        build_recipe_workload(TINY, get_recipe("optimized", optimizer="adamw"),
                              seq_len=16, device="cuda")
    with pytest.raises(ValueError, match="reduce-overhead"):
        get_recipe("optimized", compile_mode="reduce-overhead")


@pytest.mark.interpreter
def test_thirty_steps_decrease_the_loss_alike() -> None:
    losses = {}
    for name in ("eager", "optimized"):
        workload = build_recipe_workload(
            TINY, get_recipe(name, precision="fp32", compiled=False, cuda_graph=False),
            batch_size=1,
            seq_len=32)
        losses[name] = torch.tensor([workload.step().item() for _ in range(30)])
    plain, optimized = losses["eager"], losses["optimized"]
    assert plain[-1] < plain[0] - 0.5
    torch.testing.assert_close(optimized, plain, rtol=1e-3, atol=0)


def test_checkpointing_saves_less_and_changes_nothing_in_float64() -> None:
    """Every way of checkpointing gives the gradients of none; recomputing more blocks
    saves less."""
    torch.manual_seed(0)
    tokens, targets = torch.randint(TINY.vocab_size, (2, 2, 40))
    layers = TINY.num_layers
    settings = {"none": {}, "every block": {"checkpoint_every": 1},
                "first block": {"checkpoint_blocks": 1},
                "all blocks singly": {"checkpoint_blocks": layers}}
    saved, grads = {}, {}
    for name, setting in settings.items():
        torch.manual_seed(1)
        model = TransformerLM(TINY, **setting).double()
        saved[name] = saved_tensor_bytes(
            lambda m=model: cross_entropy(m(tokens), targets).backward(),
            exclude=model.parameters())
        grads[name] = [p.grad for p in model.parameters()]
    assert saved["all blocks singly"] < saved["first block"] < saved["none"]
    assert saved["every block"] == saved["all blocks singly"]  # the same segments
    for name in settings:
        for got, expected in zip(grads[name], grads["none"], strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_checkpoint_choice_recomputes_the_fewest_blocks_that_fit() -> None:
    config = MODEL_CONFIGS["2.7b"]
    memory = acc.step_memory(config, 4, 2048, "bf16", scores_saved=False)
    assert acc.checkpoint_blocks_for_budget(config, 4, 2048, "bf16", memory.peak,
                                            scores_saved=False) == 0
    layer = acc.layer_activation_bytes(config, 4, 2048, "bf16", scores_saved=False)
    boundary = acc.residual_stream_bytes(config, 4, 2048)
    # Each recomputed block keeps only its input (the peak is the start of backward).
    with_blocks = [memory.peak - k * (layer - boundary) for k in range(config.num_layers + 1)]
    for k in (1, 5, 12):
        assert acc.checkpoint_blocks_for_budget(config, 4, 2048, "bf16", with_blocks[k],
                                                scores_saved=False) == k
        assert acc.checkpoint_blocks_for_budget(config, 4, 2048, "bf16", with_blocks[k] - 1,
                                                scores_saved=False) == k + 1
    assert acc.checkpoint_blocks_for_budget(config, 4, 2048, "bf16", 1) == config.num_layers
    # Saved scores (reference attention) need more blocks recomputed for the same budget.
    budget = with_blocks[12]
    assert acc.checkpoint_blocks_for_budget(config, 4, 2048, "bf16", budget) > 12


def test_peak_model_is_a_line_in_depth_and_recomputed_blocks() -> None:
    model = PeakModel(depth=4, peak=100, per_block=20, recompute_saving=7)
    assert model.predict(4, 0) == 100
    assert model.predict(10, 0) == 100 + 6 * 20
    assert model.predict(10, 3) == 100 + 6 * 20 - 3 * 7
    assert model.fewest_recomputed(10, 220) == 0
    assert model.fewest_recomputed(10, 219) == 1
    assert model.fewest_recomputed(10, 220 - 3 * 7) == 3
    assert model.fewest_recomputed(10, 220 - 3 * 7 - 1) == 4
    assert model.fewest_recomputed(10, 1) == 10  # nothing fits: recompute every block
    with pytest.raises(ValueError, match="even number"):
        measure_peak_model(RECIPES["optimized"], TINY, 2, 16, torch.device("cpu"), depth=3)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["pytorch_baseline", "optimized"])
def test_measured_peak_model_predicts_a_deeper_step(name: str) -> None:
    """Runs at 2 and 4 blocks predict the peak of the 8-block step, with and without
    recomputed blocks."""
    device = torch.device("cuda")
    config = replace(MODEL_CONFIGS["small"], num_layers=8)
    recipe = RECIPES[name]
    model = measure_peak_model(recipe, config, 4, 1024, device)
    assert model.per_block > 0 and model.recompute_saving > 0
    for recomputed in (0, 3):
        measured = step_peak(recipe, config, 4, 1024, device, recomputed)
        predicted = model.predict(config.num_layers, recomputed)
        # What the line misses must fit in the part of the GPU the budget leaves free.
        assert BUDGET_SHARE * measured <= predicted <= measured / BUDGET_SHARE, (
            recomputed, predicted, measured)


def test_a_measured_peak_model_is_kept_for_the_same_identity_only(tmp_path) -> None:
    cache = tmp_path / "fit.json"
    measured: list[int] = []

    def measure(peak: int):
        return lambda: (measured.append(peak), PeakModel(4, peak, 20, 7))[1]

    first, cached = cached_peak_model(["H100", "2.7b", 2048], measure(100), cache)
    assert (first.peak, cached, measured) == (100, False, [100])
    again, cached = cached_peak_model(["H100", "2.7b", 2048], measure(999), cache)
    assert (again, cached, measured) == (first, True, [100])  # not measured again
    other, cached = cached_peak_model(["H200", "2.7b", 2048], measure(300), cache)
    assert (other.peak, cached) == (300, False)
    cache.write_text("{not json")  # a damaged cache is measured anew, then rewritten
    anew, cached = cached_peak_model(["H100", "2.7b", 2048], measure(101), cache)
    assert (anew.peak, cached) == (101, False)
    assert cached_peak_model(["H100", "2.7b", 2048], measure(5), cache)[1]


def test_flash_style_attention_saves_no_scores() -> None:
    config = MODEL_CONFIGS["small"]
    with_scores = acc.activation_bytes(config, 4, 1024, "bf16")
    flash = acc.activation_bytes(config, 4, 1024, "bf16", scores_saved=False)
    scores = 4 * config.num_heads * 1024 * 1024
    lse = 4 * 1024 * config.num_heads * acc.FP32
    # Mask, bf16 and fp32 probabilities per layer, against one log-sum-exp per query/head.
    per_layer = 1024 * 1024 * acc.BOOL + scores * (acc.BF16 + acc.FP32) - lse
    assert with_scores - flash == config.num_layers * per_layer
    assert saves_scores("reference") and not saves_scores("triton")
    assert not saves_scores("sdpa")


def test_recipe_overrides_and_errors() -> None:
    recipe = get_recipe("optimized", precision="fp32", checkpoint_every=2)
    assert (recipe.precision, recipe.options.checkpoint_every) == ("fp32", 2)
    assert recipe.options.fused_loss and RECIPES["optimized"].precision == "bf16"
    assert fit_to_device(recipe, TINY, 2, 16, "cpu") == Fit(recipe, None)
    with pytest.raises(ValueError, match="unknown recipe"):
        get_recipe("fastest")
    with pytest.raises(ValueError, match="unknown optimizer"):
        get_recipe("eager", optimizer="sgd")
    with pytest.raises(ValueError, match="'sharded' shards its state over data-parallel"):
        build_recipe_workload(TINY, get_recipe("eager", optimizer="sharded"), batch_size=1,
                              seq_len=8)
    with pytest.raises(ValueError, match="'ours' is now called 'adamw'"):
        get_recipe("eager", optimizer="ours")
    for bad_lr in (0.0, -1e-3, "3e-3"):
        with pytest.raises(ValueError, match="lr must be a number > 0"):
            get_recipe("eager", lr=bad_lr)
    with pytest.raises(ValueError, match="checkpoint_every"):
        TransformerLM(TINY, checkpoint_every=TINY.num_layers + 1)
    with pytest.raises(ValueError, match="checkpoint_blocks must lie in"):
        TransformerLM(TINY, checkpoint_blocks=-1)
    with pytest.raises(ValueError, match="not both"):
        TransformerLM(TINY, checkpoint_every=1, checkpoint_blocks=1)
    kept = get_recipe("optimized", checkpoint_blocks=1)
    assert fit_to_device(kept, TINY, 2, 16, "cpu").recipe.options.checkpoint_blocks == 1
