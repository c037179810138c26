"""The generated Claims section and each table's provenance: same-run ratios only, with the
kind of time each side measured."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from systems.runs import keys
from systems.runs.history import Result
from tools.docgen import results_plots as plots
from tools.docgen.claims import all_claims, summary_table
from tools.docgen.results_page import provenance, recipes_table


def _result(name: str, median: float, file: str, run: str = "", when: str = "2026-01-01",
            **info) -> Result:
    return Result(name=name, fullname=f"tests/perf/x.py::{name}", group=None,
                  stats={"mean": median * 1.01, "median": median, "stddev": median / 50},
                  info=keys.normalise(info), run=run or Path(file).name, datetime=when,
                  device="GPU fixture", file=file)


def _attention(impl: str, median: float, file: str, test: str = "test_attention",
               mode: str = "forward_backward", shape=(1, 1, 4096, 64), **extra) -> Result:
    return _result(f"{test}[{impl}-{mode}]", median, file, implementation=impl,
                   shape=list(shape), dtype="bfloat16", causal=True, mode=mode, **extra)


def test_attention_claims_are_ratios_of_medians_within_one_file() -> None:
    results = [_attention("triton", 2e-3, "G/0001_a.json"),
               _attention("sdpa_flash", 4e-3, "G/0001_a.json"),
               _attention("sdpa_cudnn", 1e-3, "G/0002_b.json")]  # no triton in that file
    (claim,) = all_claims(results)
    assert (claim.ours.who, claim.rival.who, claim.file) == ("triton", "sdpa_flash",
                                                              "G/0001_a.json")
    assert claim.ratio == pytest.approx(0.5)
    assert claim.ours.what == keys.EAGER_TIME
    row = summary_table([claim]).splitlines()[2]
    assert "| eager end-to-end (host included) |" in row and "| 0.50 | G/0001_a.json |" in row


def test_claims_take_the_newest_run_that_measured_both_and_name_the_source_run() -> None:
    old = [_attention(i, t, "G/0001_a.json", when="2026-01-01")
           for i, t in (("triton", 1e-3), ("flex_compiled", 1e-3))]
    new = [_attention(i, t, "G/0005_combined.json", run="0004_c.json", when="2026-02-01")
           for i, t in (("triton", 1e-3), ("flex_compiled", 3e-3))]
    (claim,) = all_claims(old + new)
    assert claim.ratio == pytest.approx(1 / 3)
    assert (claim.file, claim.run) == ("G/0005_combined.json", "0004_c.json")


def test_device_time_claims_come_from_replay_and_do_bench() -> None:
    replay = [_attention(i, t, "G/0023.json", test="test_attention_device_time",
                         mode="forward_backward (CUDA graph replay)", shape=(1, 4096, 64))
              for i, t in (("triton", 1e-3), ("sdpa_cudnn", 2e-3))]
    board = [_attention(i, 5e-3, "G/0022.json", test="test_attention_leaderboard",
                        do_bench_median_ms=ms)
             for i, ms in (("triton", 4.0), ("sdpa_flash", 8.0))]
    kinds = {(c.file, c.ours.what): c.ratio for c in all_claims(replay + board)}
    assert kinds == {("G/0023.json", keys.REPLAY_TIME): pytest.approx(0.5),
                     ("G/0022.json", keys.EAGER_TIME): pytest.approx(1.0),
                     ("G/0022.json", keys.DO_BENCH_TIME): pytest.approx(0.5)}


def test_rounds_taken_in_turn_claim_the_median_of_the_rounds_ratios() -> None:
    """Ours' device-time rounds in turn with the rivals: one claim per rival from the
    case's newest run, its ratio the median of the rounds' own (here 0.9, 1.0, 1.2: 1.0,
    where the medians' ratio would be 7.2 / 7.0); a variant of ours counts as ours."""
    rounds = {"triton_gluon_bwd": [6.3, 7.2, 8.4], "sdpa_cudnn": [7.0, 7.2, 7.0],
              "sdpa_flash": [9.0, 9.6, 12.0]}
    old = _attention("triton_gluon_bwd", 7e-3, "G/0001_a.json", shape=(16, 1, 16384, 128),
                     when="2026-01-01", interleaved_device_ms={
                         "triton_gluon_bwd": [9.0], "sdpa_cudnn": [7.0]})
    new = _attention("triton_gluon_bwd", 7e-3, "G/0002_b.json", shape=(16, 1, 16384, 128),
                     when="2026-02-01", interleaved_device_ms=rounds)
    claims = {c.rival.who: c for c in all_claims([old, new])}
    assert set(claims) == {"sdpa_cudnn", "sdpa_flash"}
    cudnn, flash = claims["sdpa_cudnn"], claims["sdpa_flash"]
    assert cudnn.ratio == pytest.approx(1.0) and flash.ratio == pytest.approx(0.7)
    assert cudnn.file == "G/0002_b.json" and cudnn.ours.what == keys.IN_TURN_TIME
    assert cudnn.ours.median == pytest.approx(7.2)  # ms
    assert cudnn.rival.median == pytest.approx(7.0)
    assert cudnn.ours.what == "device time (do_bench rounds taken in turn)"
    assert cudnn.file == "G/0002_b.json" and f"{cudnn.ratio:.2f}" == "1.00"


def test_recipe_and_ddp_claims_name_both_time_kinds() -> None:
    def recipe(name: str, median: float, graph: bool) -> Result:
        return _result(f"test_training_recipe[2.7b-{name}]", median, "G/0012.json",
                       size="2.7b", seq_len=512, mode="train_step", recipe=name,
                       cuda_graph=graph)

    def ddp(variant: str, step: float, **extra) -> Result:
        return _result(f"test_train_step[{variant}]", 1.0, "H/0008.json", variant=variant,
                       world_size=2, size="xl", batch_per_rank=8, seq_len=128,
                       backend="nccl", **{keys.STEP_S: step}, **extra)

    results = [recipe("optimized", 0.1, True), recipe("pytorch_baseline", 0.125, False),
               recipe("eager", 0.3, False), ddp("torch_ddp", 0.4), ddp("naive", 0.42),
               ddp("none", 0.38), ddp("fsdp", 0.3), ddp("torch_fsdp2", 0.6)]
    claims = {(c.ours.who, c.rival.who): c for c in all_claims(results)}
    assert set(claims) == {("optimized", "pytorch_baseline"), ("naive", "torch_ddp"),
                           ("fsdp", "torch_fsdp2")}
    recipe_claim = claims["optimized", "pytorch_baseline"]
    assert recipe_claim.ratio == pytest.approx(0.8)
    assert (f"ours: {keys.REPLAY_TIME}; rival: {keys.EAGER_TIME}"
            in summary_table([recipe_claim]))
    assert claims["naive", "torch_ddp"].ratio == pytest.approx(1.05)
    assert claims["fsdp", "torch_fsdp2"].ours.what == keys.RANK_EVENT_TIME


def test_recipe_tables_never_pair_across_runs() -> None:
    recipes = [_result(f"r-{name}", 0.1, file, size="small", seq_len=512,
                       mode="train_step", recipe=name)
               for name, file in (("optimized", "G/0001.json"),
                                  ("pytorch_baseline", "G/0002.json"))]
    assert "| small | 512 | - | - |" in recipes_table(recipes)  # not side by side


def test_provenance_names_time_kinds_and_files() -> None:
    results = [_attention("triton", 1e-3, "G/0014_quick.json", run="0012_quick.json"),
               _attention("triton", 1e-3, "G/0023.json", mode="forward_backward (CUDA graph "
                          "replay)", shape=(1, 8192, 64))]
    text = provenance(results, by=keys.PASS)
    assert text.startswith(f"Time: forward_backward (CUDA graph replay): {keys.REPLAY_TIME}; "
                           f"forward_backward: {keys.EAGER_TIME}. From: ")
    assert "`G/0014_quick.json (measured in 0012_quick.json)`, `G/0023.json`" in text
    assert provenance([]) == ""


@pytest.fixture
def figures(monkeypatch) -> list:
    """The figures the plot functions save, kept open for inspection."""
    kept = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.append(fig) or path)
    return kept


def test_bucket_sweep_time_axis_starts_at_zero(figures, tmp_path) -> None:
    ddp = [_result(f"b{mb}", 1.0, "H/1.json", variant="bucketed", world_size=2,
                   **{keys.BUCKET_SIZE_MB: mb, keys.STEP_S: 0.400 + mb * 1e-6})
           for mb in (1, 10, 100, 1000)]
    plots.ddp_variants(ddp, tmp_path / "d.png")
    (fig,) = figures
    sweep = fig.axes[-1]
    assert sweep.get_ylim()[0] == 0
    assert any("+0.2%" in t.get_text() for t in sweep.texts)  # the spread, written out


def _device(impl: str, n: int, ms: float, file: str, when: str = "2026-01-01",
            d: int = 64) -> Result:
    return _attention(impl, ms * 1e-3, file, test="test_attention_device_time",
                      mode="forward_backward (CUDA graph replay)", shape=(1, 1, n, d),
                      when=when, flops=4e12 * ms * 1e-3, timing="device")


def test_attention_device_plot_draws_tflops_of_one_run_with_gaps_not_bridges(
        figures, tmp_path) -> None:
    lengths = (1024, 2048, 4096, 8192)
    results = [_device("triton", n, 1.0, "G/2.json", "2026-02-01") for n in lengths]
    results += [_device("sdpa_flash", n, 2.0, "G/2.json", "2026-02-01")
                for n in lengths if n != 4096]  # one length missing
    results += [_device("sdpa_cudnn", 1024, 0.5, "G/2.json", "2026-02-01")]  # one point
    results += [_device(impl, n, 9.0, "G/1.json") for impl in ("triton", "sdpa_flash")
                for n in lengths]  # an older run: never mixed in
    plots.attention_device(results, tmp_path / "a.png")
    (fig,) = figures
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"triton", "sdpa_flash"}  # a single point is no line
    assert list(lines["triton"].get_ydata()) == pytest.approx([4.0] * 4)  # TFLOP/s
    flash = list(lines["sdpa_flash"].get_ydata())
    assert math.isnan(flash[2]) and flash[3] == pytest.approx(4.0)  # a gap, not a bridge
    assert ax.get_ylim()[0] == 0
    assert "G/2.json" in fig.texts[0].get_text()


def test_attention_eager_plot_takes_batch_one_and_says_its_scale_is_log(figures,
                                                                        tmp_path) -> None:
    results = [_attention(impl, ms * n / 1024 * 1e-3, "G/1.json", shape=(1, 1, n, 128))
               for impl, ms in (("triton", 0.2), ("sdpa_flash", 0.3))
               for n in (1024, 4096, 16384)]
    results += [_attention("triton", 1e-3, "G/1.json", shape=(4, 1, 1024, 128))]  # batch 4
    plots.attention_eager(results, tmp_path / "e.png")
    (fig,) = figures
    (ax,) = fig.axes
    assert "log scale" in ax.get_ylabel() and ax.get_yscale() == "log"
    assert "d = 128" in ax.get_title()
    assert list(ax.get_lines()[0].get_xdata()) == [1024, 4096, 16384]


def test_attention_plots_need_two_series_of_three_lengths(tmp_path) -> None:
    results = [_device("triton", n, 1.0, "G/1.json") for n in (1024, 2048, 4096)]
    results += [_device("sdpa_flash", n, 1.0, "G/1.json") for n in (1024, 2048)]
    assert plots.attention_device(results, tmp_path / "a.png") is None


def test_train_step_plot_sets_each_recipe_beside_its_floor(figures, tmp_path) -> None:
    results = [_result(f"test_training_recipe[2.7b-{name}]", ms * 1e-3, "G/1.json",
                       size="2.7b", seq_len=512, mode="train_step", recipe=name,
                       flops=40e12, peak_tflops=1000.0)
               for name, ms in (("eager", 300.0), ("pytorch_baseline", 120.0),
                                ("optimized", 100.0))]
    plots.train_step_recipes(results, tmp_path / "t.png")
    (fig,) = figures
    ax = fig.axes[0]
    assert [p.get_width() for p in ax.patches] == pytest.approx([300.0, 120.0, 100.0])
    (floor,) = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert floor.get_xdata()[0] == pytest.approx(40.0)  # 40 TFLOP at 1000 TFLOP/s
    assert ax.get_xlim()[0] == 0


def test_plots_select_no_backend_at_import() -> None:
    source = Path(plots.__file__).read_text()
    assert "matplotlib.use(" not in source and "import matplotlib.pyplot" not in source


def test_claims_summary_gathers_a_comparison_into_one_row() -> None:
    results = []
    for n, ours in ((1024, 1e-3), (2048, 3e-3), (4096, 1e-3)):
        results += [_attention("triton", ours, "G/0001_a.json", shape=(1, 1, n, 64)),
                    _attention("sdpa_flash", 2e-3, "G/0001_a.json", shape=(1, 1, n, 64))]
    table = summary_table(all_claims(results))
    assert "| attention | triton | sdpa_flash | eager end-to-end (host included) | " \
        "3 workloads | 2 | 0.50 (0.50–1.50) | G/0001_a.json |" in table


def test_histories_at_any_depth_are_found_and_named_relative_to_the_root(tmp_path) -> None:
    import json

    from systems.runs.history import load_runs

    def save(relative: str, impl: str, seconds: float) -> None:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        bench = {"name": f"test_attention[{impl}]", "fullname": f"t.py::test_attention[{impl}]",
                 "params": {"impl": impl},  # new files save params as plain dicts
                 "stats": {"mean": seconds, "median": seconds, "iqr": 0.0, "rounds": 5},
                 "extra_info": {"implementation": impl, "shape": [1, 1024, 64],
                                "mode": "forward_backward", "dtype": "bfloat16"}}
        path.write_text(json.dumps({"machine_info": {"device_name": "GPU X"},
                                    "commit_info": {"id": "abc"}, "datetime": "2026-01-01",
                                    "benchmarks": [bench]}))

    save("GPU_X/studies/sweep/0003_study.json", "triton", 1e-3)
    save("GPU_X/machine/0002_baseline.json", "sdpa_flash", 2e-3)
    runs = load_runs(tmp_path)
    files = sorted(r.file for run in runs for r in run.results)
    assert files == ["GPU_X/machine/0002_baseline.json", "GPU_X/studies/sweep/0003_study.json"]
    assert all_claims([r for run in runs for r in run.results]) == []  # different files


def test_recipe_tables_are_ratios_of_medians_like_the_claims() -> None:
    def skewed(result: Result, mean: float) -> Result:
        # One slow round: the mean moves, the median does not.
        return Result(**{**result.__dict__, "stats": {**result.stats, "mean": mean}})

    recipes = [skewed(_result(f"test_training_recipe[2.7b-{name}]", median, "G/0002.json",
                              size="2.7b", context_length=512, mode="train_step",
                              recipe=name), mean)
               for name, median, mean in (("eager", 0.3, 3.0), ("pytorch_baseline", 0.15, 0.15),
                                          ("optimized", 0.12, 1.2))]
    assert "| 2.7b | 512 | 300.00 | 150.00 | 120.00 | 1.25x | 2.50x |" in recipes_table(recipes)


def test_a_recorded_clock_names_the_time_kind_over_the_guess() -> None:
    graphed = {keys.CUDA_GRAPH: True, keys.MODE: "train_step"}
    assert keys.time_kind(graphed) == keys.REPLAY_TIME  # older runs: told by the option
    # The graph was not captured by the end of warm-up: the rounds read the host clock.
    assert keys.time_kind({**graphed, keys.TIMING: "wall"}) == keys.EAGER_TIME
    assert keys.time_kind({keys.MODE: "forward", keys.TIMING: "device"}) == keys.REPLAY_TIME
