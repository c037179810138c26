"""The regression gate's statistics (systems.runs.gate) on synthetic runs."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
from pathlib import Path

import pytest

import systems.runs.baseline as baseline_module
from systems.runs import keys
from systems.runs.baseline import add_repeat, host_loop_ms_runs
from systems.runs.baseline import main as baseline_main
from systems.runs.gate import (
    CEILING,
    DRIFT_FACTOR,
    FLOOR,
    SPREAD_FACTOR,
    Timing,
    Verdict,
    compare,
    describe,
    gate_table,
    host_speed_line,
    judge,
    regressions,
    threshold,
)


def measured(rng: random.Random, seconds: float, noise: float, rounds: int = 7) -> Timing:
    """Median and IQR of `rounds` draws around `seconds` with relative gaussian noise."""
    draws = sorted(rng.gauss(seconds, noise * seconds) for _ in range(rounds))
    q1, _, q3 = statistics.quantiles(draws, n=4)
    return Timing(median=statistics.median(draws), iqr=q3 - q1)


def test_unchanged_noisy_reruns_raise_no_alarm() -> None:
    rng = random.Random(0)
    cases = {f"case{i}": 1e-3 * (1 + i) for i in range(40)}
    baseline = {name: measured(rng, s, 0.01) for name, s in cases.items()}
    for _ in range(3):
        rerun = {name: measured(rng, s, 0.01) for name, s in cases.items()}
        results = compare(baseline, rerun)
        assert regressions(results) == []
        assert {r.verdict for r in results} == {Verdict.OK}


def test_a_15_percent_slowdown_is_caught_in_every_case() -> None:
    rng = random.Random(1)
    cases = {f"case{i}": 1e-3 * (1 + i) for i in range(40)}
    baseline = {name: measured(rng, s, 0.01) for name, s in cases.items()}
    slower = {name: measured(rng, 1.15 * s, 0.01) for name, s in cases.items()}
    results = compare(baseline, slower)
    assert [r.name for r in regressions(results)] == list(cases)
    assert all(r.change == pytest.approx(0.15, abs=0.03) for r in results)


def test_a_speedup_is_reported_but_does_not_fail() -> None:
    result = judge("x", Timing(0.010, 0.0001), Timing(0.008, 0.0001))
    assert result.verdict is Verdict.FASTER
    assert regressions([result]) == []


def test_threshold_never_drops_below_the_floor() -> None:
    exact = Timing(0.010, 0.0)
    assert threshold(exact, exact) == FLOOR
    just_inside = Timing(0.010 * (1 + FLOOR * 0.9), 0.0)
    assert judge("x", exact, just_inside).verdict is Verdict.OK
    just_outside = Timing(0.010 * (1 + FLOOR * 1.1), 0.0)
    assert judge("x", exact, just_outside).verdict is Verdict.SLOWER


def test_threshold_follows_the_noisier_run() -> None:
    tight, loose = Timing(0.010, 0.0001), Timing(0.010, 0.0005)  # spreads 1% and 5%
    assert threshold(tight, loose) == pytest.approx(SPREAD_FACTOR * 0.05)
    assert threshold(loose, tight) == pytest.approx(SPREAD_FACTOR * 0.05)
    # 8% slower is inside the 10% this noise allows, outside the floor alone.
    assert judge("x", loose, Timing(0.0108, 0.0001)).verdict is Verdict.OK


def test_too_noisy_cases_are_reported_not_silently_passed() -> None:
    spread = 1.1 * CEILING / SPREAD_FACTOR
    noisy = Timing(0.010, spread * 0.010)
    result = judge("x", noisy, Timing(0.020, 0.0))  # twice as slow, but cannot be told
    assert result.verdict is Verdict.TOO_NOISY
    table = gate_table([result])
    assert f"not gated (too noisy: spread {spread:.1%})" in table
    assert table.splitlines()[-1].endswith("1 not gated")


def test_missing_and_new_cases_are_reported() -> None:
    baseline = {"kept": Timing(0.01, 0.0), "removed": Timing(0.01, 0.0)}
    current = {"kept": Timing(0.01, 0.0), "added": Timing(0.01, 0.0)}
    results = {r.name: r.verdict for r in compare(baseline, current)}
    assert results == {"kept": Verdict.OK, "added": Verdict.NEW, "removed": Verdict.NOT_RUN}


def test_table_has_one_row_per_case_with_the_numbers() -> None:
    results = compare({"a": Timing(0.010, 0.0)}, {"a": Timing(0.0125, 0.0)})
    header, rule, row, tally = gate_table(results).splitlines()
    assert header.split() == ["case", "clock", "baseline", "ms", "current", "ms", "change",
                              "threshold", "verdict"]
    assert row.split() == ["a", "wall", "10.000", "12.500", "+25.0%", f"{FLOOR:.1%}",
                           "SLOWER"]
    assert tally == "1 SLOWER, 1 gated on wall"


def test_a_case_needs_a_timing_on_at_least_one_side() -> None:
    with pytest.raises(ValueError, match="neither"):
        judge("x", None, None)


def test_drift_between_baseline_runs_widens_the_threshold() -> None:
    steady = Timing(0.010, 0.0001, run_medians=(0.0100, 0.0101, 0.0099))
    drifting = Timing(0.010, 0.0001, run_medians=(0.0095, 0.0100, 0.0105))  # 10.5% range
    current = Timing(0.0110, 0.0001)  # +10%
    assert judge("x", steady, current).verdict is Verdict.SLOWER
    wide = judge("x", drifting, current)
    assert wide.threshold == pytest.approx(DRIFT_FACTOR * (0.0105 / 0.0095 - 1))
    assert wide.verdict is Verdict.TOO_NOISY  # 1.5 x 10.5% exceeds the ceiling
    assert "drift between runs 10.5%" in describe(wide)
    assert Timing(0.010, 0.0).drift == 0.0  # a single run says nothing about drift


def probed(host_ms: float | None) -> dict:
    """machine_info entries of a run that recorded the host speed probe (none for None)."""
    return {} if host_ms is None else {keys.HOST_PYTHON_LOOP_MS: host_ms}


def test_repeats_pool_rounds_and_keep_each_runs_median() -> None:
    def run(commit: str, data: list[float], host_ms: float | None = None) -> dict:
        return {"commit_info": {"id": commit},
                "machine_info": {"device_name": "GPU", "gpu_count": 1, **probed(host_ms)},
                "benchmarks": [{"name": "c", "fullname": "t.py::c", "extra_info": {},
                                "stats": {"data": data, "median": statistics.median(data),
                                          "iterations": 1}}]}

    pooled = add_repeat(run("a", [1.0, 2.0, 3.0], 10.0), run("a", [4.0, 5.0, 6.0], 12.5))
    pooled = add_repeat(pooled, run("a", [7.0, 8.0, 9.0], 11.0))
    assert pooled["machine_info"][keys.HOST_PYTHON_LOOP_MS_RUNS] == [10.0, 12.5, 11.0]
    assert pooled["machine_info"][keys.HOST_PYTHON_LOOP_MS] == 10.0  # the first run's
    assert host_loop_ms_runs(pooled) == [10.0, 12.5, 11.0]
    # A run without the probe (saved before it existed) leaves the pooled file without it,
    # never with a list that covers only some of its runs.
    for first, second in ((None, 12.5), (10.0, None), (None, None)):
        unprobed = add_repeat(run("a", [1.0], first), run("a", [2.0], second))
        assert host_loop_ms_runs(unprobed) == []
        assert unprobed["machine_info"] == {"device_name": "GPU", "gpu_count": 1}
    assert host_loop_ms_runs(add_repeat(unprobed, run("a", [3.0], 11.0))) == []
    with pytest.raises(ValueError, match="host_python_loop_ms: 'fast' is not a positive"):
        add_repeat(run("a", [1.0], "fast"), run("a", [2.0], 12.5))
    (bench,) = pooled["benchmarks"]
    assert bench["stats"]["data"] == [float(x) for x in range(1, 10)]
    assert bench["stats"]["median"] == 5.0 and bench["stats"]["rounds"] == 9
    assert bench["extra_info"]["run_medians"] == [2.0, 5.0, 8.0]
    timing = Timing.from_saved(bench["stats"], bench["extra_info"])
    assert timing.run_medians == (2.0, 5.0, 8.0) and timing.drift == pytest.approx(3.0)
    with pytest.raises(ValueError, match="commit_info.id"):
        add_repeat(run("a", [1.0]), run("b", [1.0]))
    other_case = run("a", [1.0])
    other_case["benchmarks"][0]["fullname"] = "t.py::d"
    with pytest.raises(ValueError, match="exactly the baseline's cases"):
        add_repeat(run("a", [1.0]), other_case)


def test_repeats_pool_do_bench_readings_only_where_every_run_has_one() -> None:
    def run(do_bench: tuple[float, float] | None) -> dict:
        info = {} if do_bench is None else {keys.DO_BENCH_MEDIAN_MS: do_bench[0],
                                            keys.DO_BENCH_MEAN_MS: do_bench[1]}
        return {"commit_info": {"id": "a"}, "machine_info": {"device_name": "GPU",
                                                             "gpu_count": 1},
                "benchmarks": [{"name": "c", "fullname": "t.py::c", "extra_info": info,
                                "stats": {"data": [1.0], "median": 1.0, "iterations": 1}}]}

    pooled = add_repeat(run((7.0, 7.3)), run((7.6, 7.9)))
    pooled = add_repeat(pooled, run((7.2, 7.2)))
    (info,) = (bench["extra_info"] for bench in pooled["benchmarks"])
    assert keys.DO_BENCH_IQR_MS not in info  # none of the runs recorded one
    assert info[keys.DO_BENCH_RUN_MEDIANS_MS] == [7.0, 7.6, 7.2]
    assert info[keys.DO_BENCH_MEDIAN_MS] == 7.2  # the median run's, not the first run's
    assert info[keys.DO_BENCH_MEAN_MS] == pytest.approx((7.3 + 7.9 + 7.2) / 3)
    # A run without a reading leaves the pooled case without one.
    for first, second in (((7.0, 7.3), None), (None, (7.0, 7.3))):
        (bench,) = add_repeat(run(first), run(second))["benchmarks"]
        assert not {keys.DO_BENCH_MEDIAN_MS, keys.DO_BENCH_MEAN_MS,
                    keys.DO_BENCH_RUN_MEDIANS_MS} & set(bench["extra_info"])


def test_repeats_pool_rounds_taken_in_turn_run_after_run() -> None:
    def run(rounds: dict | None) -> dict:
        info = {} if rounds is None else {keys.INTERLEAVED_DEVICE_MS: rounds}
        return {"commit_info": {"id": "a"}, "machine_info": {"device_name": "GPU",
                                                             "gpu_count": 1},
                "benchmarks": [{"name": "c", "fullname": "t.py::c", "extra_info": info,
                                "stats": {"data": [1.0], "median": 1.0, "iterations": 1}}]}

    first = {"triton": [7.0, 7.1], "sdpa_cudnn": [7.2, 7.3]}
    second = {"triton": [6.9], "sdpa_cudnn": [7.4]}
    (bench,) = add_repeat(run(first), run(second))["benchmarks"]
    assert bench["extra_info"][keys.INTERLEAVED_DEVICE_MS] == {
        "triton": [7.0, 7.1, 6.9], "sdpa_cudnn": [7.2, 7.3, 7.4]}
    # Rounds of only one run, or of other implementations, are not the pooled case's.
    for other in (None, {"triton": [6.9]}):
        (bench,) = add_repeat(run(first), run(other))["benchmarks"]
        assert keys.INTERLEAVED_DEVICE_MS not in bench["extra_info"]


def test_short_wall_timed_rounds_are_not_gated_but_device_timed_ones_are() -> None:
    short = Timing(0.001, 0.00001, kind="wall")
    slowed = Timing(0.0015, 0.00001, kind="wall")
    result = judge("x", short, slowed)
    assert result.verdict is Verdict.TOO_NOISY and result.short_wall_round
    assert describe(result) == "not gated (wall time under 2 ms: host-bound)"
    replayed = judge("x", Timing(0.001, 0.00001, kind="device"),
                     Timing(0.0015, 0.00001, kind="device"))
    assert replayed.verdict is Verdict.SLOWER
    long_wall = judge("x", Timing(0.010, 0.0001, kind="wall"),
                      Timing(0.0115, 0.0001, kind="wall"))
    assert long_wall.verdict is Verdict.SLOWER
    saved = Timing.from_saved({"median": 0.001, "iqr": 0.0}, {"timing": "wall"})
    assert saved.short_wall_round


def test_wall_timed_rounds_the_host_spent_enqueueing_are_not_gated() -> None:
    """A round whose host was still launching for 90% of it times the host's CPU."""
    host_bound = Timing(0.020, 0.0001, kind="wall", host_enqueue=0.0195)
    slowed = Timing(0.023, 0.0001, kind="wall", host_enqueue=0.0225)
    result = judge("x", host_bound, slowed)
    assert result.verdict is Verdict.TOO_NOISY and not result.short_wall_round
    assert describe(result) == "not gated (host-bound: enqueueing took 97.8% of a round)"
    # Either run being host-bound is enough; a GPU-bound wall case is still gated.
    gpu_bound = Timing(0.020, 0.0001, kind="wall", host_enqueue=0.012)
    assert judge("x", gpu_bound, slowed).verdict is Verdict.TOO_NOISY
    assert judge("x", gpu_bound, Timing(0.023, 0.0001, kind="wall",
                                        host_enqueue=0.012)).verdict is Verdict.SLOWER
    # Device-timed rounds (a graph replay: one launch) are never host-bound.
    replay = Timing(0.020, 0.0001, kind="device", host_enqueue=0.0199)
    assert not replay.host_bound and replay.host_share is None
    assert judge("x", replay, Timing(0.023, 0.0001, kind="device")).verdict is Verdict.SLOWER
    saved = Timing.from_saved({"median": 0.05, "iqr": 0.0},
                              {keys.TIMING: "wall", keys.HOST_ENQUEUE_S: 0.049})
    assert saved.host_bound and saved.host_share == pytest.approx(0.98)
    assert Timing.from_saved({"median": 0.05, "iqr": 0.0}, {keys.TIMING: "wall"}).host_share \
        is None
    # Work that runs on the CPU (gloo's all-reduce of CPU tensors) is the host's own.
    on_cpu = Timing.from_saved({"median": 0.005, "iqr": 0.0},
                               {keys.TIMING: "wall", keys.TORCH_DEVICE: "cpu"})
    assert on_cpu.host_bound and on_cpu.host_share == 1.0
    result = judge("x", on_cpu, Timing(0.008, 0.0, kind="wall", on_cpu=True))
    assert describe(result) == "not gated (host-bound: runs on the CPU)"
    on_gpu = Timing.from_saved({"median": 0.005, "iqr": 0.0},
                               {keys.TIMING: "wall", keys.TORCH_DEVICE: "cuda:0"})
    assert not on_gpu.host_bound


def test_host_speed_line_sets_this_run_against_the_baselines_runs() -> None:
    assert host_speed_line(12.9, [10.8, 12.2, 11.9]) == (
        "host speed: a fixed Python loop took 12.9 ms in this run, 10.8-12.2 ms in the "
        "baseline's 3 runs (+8% vs their median); host-bound eager cases can move with it")
    assert host_speed_line(10.0, [12.5]) == (
        "host speed: a fixed Python loop took 10.0 ms in this run, 12.5 ms in the "
        "baseline's run (-20%); host-bound eager cases can move with it")
    assert host_speed_line(None, [12.5]) is None  # either side saved without the probe
    assert host_speed_line(10.0, []) is None


def test_saved_runs_can_be_judged_again_from_the_command_line(tmp_path, capsys) -> None:
    def saved(name: str, median: float, host_ms: float | None = None) -> Path:
        run = {"machine_info": {"device_name": "GPU", "gpu_count": 1, **probed(host_ms)},
               "commit_info": {"id": "a"}, "datetime": "2026-01-01T00:00:00",
               "benchmarks": [{"name": "c", "fullname": "t.py::c", "extra_info": {},
                               "params": {}, "stats": {"median": median, "iqr": 0.0,
                                                       "mean": median, "rounds": 5}}]}
        path = tmp_path / name
        path.write_text(json.dumps(run))
        return path

    base = saved("base.json", 0.010)
    assert baseline_main(["judge", str(saved("same.json", 0.0101)), "--against",
                          str(base)]) == 0
    out = capsys.readouterr().out
    assert "1 ok" in out and "host speed" not in out
    assert baseline_main(["judge", str(saved("slow.json", 0.0115)), "--against",
                          str(base)]) == 1
    assert "SLOWER" in capsys.readouterr().out

    # The probe is shown where both runs carry it, and changes no verdict.
    probed_base = saved("probed_base.json", 0.010, host_ms=10.0)
    slow_host = str(saved("slow_host.json", 0.0101, host_ms=11.0))
    assert baseline_main(["judge", slow_host, "--against", str(probed_base)]) == 0
    header, line, *_ = capsys.readouterr().out.splitlines()
    assert "perf gate:" in header and "(commit a)" in header
    assert line.startswith("host speed: a fixed Python loop took 11.0 ms in this run, "
                           "10.0 ms in the baseline's run (+10%);")
    assert baseline_main(["judge", slow_host, "--against", str(base)]) == 0
    assert "host speed" not in capsys.readouterr().out
    # Parts of one run combined into a baseline ran in sessions of their own: no one
    # part's probe stands for the whole.
    root = tmp_path / "benchmarks"
    assert baseline_main(["combine", str(probed_base), slow_host, "--root", str(root)]) == 0
    capsys.readouterr()
    assert baseline_main(["judge", slow_host, "--root", str(root)]) == 0
    assert "host speed" not in capsys.readouterr().out


def test_a_run_on_several_gpus_is_judged_against_both_of_its_baselines(tmp_path,
                                                                       capsys) -> None:
    """The single-GPU suites' cases against the one-GPU baseline, the distributed suite's
    against the baseline of the run's GPU count."""
    def saved(path: Path, gpus: int, medians: dict[str, float]) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "machine_info": {"device_name": "GPU", "gpu_count": gpus},
            "commit_info": {"id": f"c{gpus}"}, "datetime": "2026-01-01T00:00:00",
            "benchmarks": [{"name": name, "fullname": f"t.py::{name}", "extra_info": {},
                            "params": {}, "stats": {"median": median, "iqr": 0.0,
                                                    "mean": median, "rounds": 5}}
                           for name, median in medians.items()]}))
        return path

    root = tmp_path / "benchmarks"
    run = saved(tmp_path / "run.json", 2, {"one_gpu": 0.0101, "ranks": 0.0202})
    saved(root / "GPU" / "baseline_1gpu.json", 1, {"one_gpu": 0.010})
    assert baseline_main(["judge", str(run), "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "baseline_1gpu.json (commit c1)" in out and "1 ok" in out and "1 new" in out
    saved(root / "GPU" / "baseline_2gpu.json", 2, {"ranks": 0.015})
    assert baseline_main(["judge", str(run), "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "baseline_2gpu.json (commit c2), " in out and "baseline_1gpu.json (commit c1)" in out
    assert "1 ok" in out and "1 SLOWER" in out


def test_parts_of_runs_combine_into_a_baseline_and_pool_as_repeats(tmp_path, capsys) -> None:
    """Parts of a run too long for one go: the first run's parts become the baseline, a
    later run's parts pool into it as one more run; parts of two commits are refused."""
    def part(name: str, commit: str, case: str, data: list[float]) -> str:
        median = sorted(data)[len(data) // 2]
        run = {"machine_info": {"device_name": "GPU", "gpu_count": 1},
               "commit_info": {"id": commit}, "datetime": "2026-01-01T00:00:00",
               "benchmarks": [{"name": case, "fullname": f"t.py::{case}", "extra_info": {},
                               "params": {}, "stats": {"median": median, "iqr": 0.0,
                                                       "mean": median, "rounds": len(data),
                                                       "data": data, "iterations": 1}}]}
        path = tmp_path / name
        path.write_text(json.dumps(run))
        return str(path)

    root = ["--root", str(tmp_path / "benchmarks")]
    first = [part("a1.json", "abc", "a", [1.0, 1.0, 1.0]), part("b1.json", "abc", "b", [2.0] * 3)]
    second = [part("a2.json", "abc", "a", [1.2] * 3), part("b2.json", "abc", "b", [2.2] * 3)]
    assert baseline_main(["combine", *second, "--repeat", *root]) == 2  # nothing to pool into
    assert "combine the first run's parts without --repeat" in capsys.readouterr().err
    assert baseline_main(["combine", *first, *root]) == 0
    assert baseline_main(["combine", *second, "--repeat", *root]) == 0
    baseline = json.loads((tmp_path / "benchmarks/GPU/baseline_1gpu.json").read_text())
    by_case = {b["name"]: b for b in baseline["benchmarks"]}
    assert by_case["a"]["extra_info"]["run_medians"] == [1.0, 1.2]
    assert by_case["b"]["extra_info"]["run_medians"] == [2.0, 2.2]
    assert by_case["b"]["stats"]["rounds"] == 6
    assert baseline["combined_from"] == ["a1.json", "b1.json", "a2.json", "b2.json"]
    capsys.readouterr()
    other_commit = [part("a3.json", "abc", "a", [1.0] * 3), part("b3.json", "def", "b", [2.0])]
    assert baseline_main(["combine", *other_commit, *root]) == 2
    assert "parts must be runs of one recorded commit" in capsys.readouterr().err
    # A repeat of another commit, or of other cases, is not pooled either.
    late = [part("a4.json", "def", "a", [1.0] * 3), part("b4.json", "def", "b", [2.0] * 3)]
    assert baseline_main(["combine", *late, "--repeat", *root]) == 2
    assert "must match the baseline's commit_info.id" in capsys.readouterr().err
    assert baseline_main(["combine", first[0], "--repeat", *root]) == 2
    assert "exactly the baseline's cases" in capsys.readouterr().err


def test_a_baseline_part_runs_its_cases_as_a_study(monkeypatch, capsys) -> None:
    ran = []
    monkeypatch.setattr(baseline_module.subprocess, "run",
                        lambda command, check: ran.append(command) or
                        subprocess.CompletedProcess(command, 3))
    assert baseline_main(["part", "training", "--benchmark-columns=median"]) == 3
    (command,) = ran
    assert "tests/perf/test_training_recipes.py" in command
    assert "--perf-study=baseline_part_training" in command
    assert "--perf-profile=quick" in command and command[-1] == "--benchmark-columns=median"
    with pytest.raises(SystemExit):
        baseline_main(["part", "everything"])
    assert "invalid choice: 'everything'" in capsys.readouterr().err


def _gpu_case(wall_s: float, busy_s: float, *, enqueue_s: float, probe_ms: float = 10.0,
              wall_noise: float = 0.01, rounds: int = 7) -> Timing:
    """A GPU case as the harness saves it: wall rounds, host rounds and the device clock."""
    rng = random.Random(int(wall_s * 1e6) + int(busy_s * 1e6))

    def rounds_of(seconds: float, noise: float) -> list[float]:
        return [seconds * (1 + rng.uniform(-noise, noise)) for _ in range(rounds)]

    wall = rounds_of(wall_s, wall_noise)
    q1, _, q3 = statistics.quantiles(sorted(wall), n=4)
    return Timing.from_saved(
        {"median": statistics.median(wall), "iqr": q3 - q1},
        {keys.TIMING: "wall", keys.HOST_ENQUEUE_S: enqueue_s, keys.TORCH_DEVICE: "cuda:0",
         keys.DEVICE_KERNEL_S: rounds_of(busy_s, 0.005),
         keys.HOST_ENQUEUE_ROUNDS_S: rounds_of(enqueue_s, 0.01)}, [probe_ms])


def test_a_host_bound_case_is_gated_on_the_device_clock_and_host_checked() -> None:
    """An eager call of 0.3 ms, 95% of it the host launching: the wall clock times the host,
    the device clock (busy 0.1 ms) does not."""
    base = _gpu_case(0.0003, 0.0001, enqueue_s=0.000285)
    # A slower host (the probe too): wall time moves a lot, the device clock not at all.
    slow_host = _gpu_case(0.0004, 0.0001, enqueue_s=0.00038, probe_ms=13.3)
    result = judge("x", base, slow_host)
    assert (result.verdict, result.clock) == (Verdict.OK, "device busy")
    assert result.host is not None and not result.host.slower
    # 8% more GPU work is caught on the device clock.
    slower_gpu = judge("x", base, _gpu_case(0.0003, 0.000108, enqueue_s=0.000285))
    assert (slower_gpu.verdict, slower_gpu.clock) == (Verdict.SLOWER, "device busy")
    # A slower Python path on the same host: the host check, not the device clock.
    slower_path = judge("x", base, _gpu_case(0.0004, 0.0001, enqueue_s=0.00038))
    assert slower_path.verdict is Verdict.OK and slower_path.host.slower
    assert regressions([slower_path]) == [slower_path]
    assert "host SLOWER" in gate_table([slower_path])


def test_a_gpu_bound_case_is_judged_on_its_steadiest_clock_without_a_host_check() -> None:
    base = _gpu_case(0.050, 0.049, enqueue_s=0.005, wall_noise=0.04)
    result = judge("x", base, _gpu_case(0.050, 0.049, enqueue_s=0.005, wall_noise=0.04))
    assert result.clock == "device busy" and result.host is None
    assert result.threshold == pytest.approx(0.05)
    # Without the device clock on one side, the rounds are what both runs share.
    wall_only = Timing(base.median, base.iqr, kind="wall", host_enqueue=0.005)
    assert judge("x", wall_only, base).clock == "wall"


def test_repeats_pool_the_device_clock_and_keep_each_runs_median() -> None:
    def run(busy: list[float] | None) -> dict:
        info = {} if busy is None else {keys.DEVICE_KERNEL_S: busy}
        return {"commit_info": {"id": "a"}, "machine_info": {"device_name": "G", "gpu_count": 1},
                "benchmarks": [{"fullname": "t::c", "extra_info": info,
                                "stats": {"data": [1.0], "median": 1.0, "iterations": 1}}]}

    pooled = add_repeat(run([0.010, 0.011, 0.012]), run([0.020, 0.021, 0.022]))
    info = pooled["benchmarks"][0]["extra_info"]
    assert info[keys.DEVICE_KERNEL_S] == [0.010, 0.011, 0.012, 0.020, 0.021, 0.022]
    assert info[keys.DEVICE_KERNEL_RUN_MEDIANS] == [0.011, 0.021]
    timing = Timing.from_saved({"median": 1.0, "iqr": 0.0}, info)
    assert timing.device_busy.drift == pytest.approx(0.021 / 0.011 - 1)
    # A clock of only some runs is not the pooled case's.
    (bench,) = add_repeat(run([0.010]), run(None))["benchmarks"]
    assert keys.DEVICE_KERNEL_S not in bench["extra_info"]


def _do_bench_case(busy_run_medians: list[float], do_bench_run_medians: list[float],
                   do_bench_iqr_ms: float = 0.05) -> Timing:
    """A pooled case of many matrices: its device clock's rounds at each run's level (the
    GPU's clock state moved between runs), and do_bench's reading of each run."""
    busy = [level * (1 + 0.002 * i) for level in busy_run_medians for i in range(5)]
    return Timing.from_saved(
        {"median": statistics.median(busy), "iqr": 0.0},
        {keys.TIMING: "wall", keys.HOST_ENQUEUE_S: 0.0006, keys.TORCH_DEVICE: "cuda:0",
         keys.DEVICE_KERNEL_S: busy, keys.DEVICE_KERNEL_RUN_MEDIANS: busy_run_medians,
         keys.RUN_MEDIANS: busy_run_medians,
         keys.DO_BENCH_MEDIAN_MS: statistics.median(do_bench_run_medians) * 1e3,
         keys.DO_BENCH_RUN_MEDIANS_MS: [m * 1e3 for m in do_bench_run_medians],
         keys.DO_BENCH_IQR_MS: do_bench_iqr_ms})


def test_a_case_whose_eager_clocks_drift_between_runs_is_gated_on_do_bench() -> None:
    """The device clock of eager rounds moved 12% between three unchanged runs (the GPU's
    clock state), do_bench's 1%: do_bench gates the case at the device floor, and 8% more
    GPU work in each call is caught there."""
    base = _do_bench_case([0.00610, 0.00663, 0.00682], [0.00651, 0.00651, 0.00657])
    same = _do_bench_case([0.00640], [0.00654])
    result = judge("x", base, same)
    assert (result.verdict, result.clock) == (Verdict.OK, "do_bench")
    assert result.threshold == pytest.approx(0.05)
    slower = judge("x", base, _do_bench_case([0.00640], [0.00654 * 1.08]))
    assert (slower.verdict, slower.clock) == (Verdict.SLOWER, "do_bench")
    assert "do_bench" in gate_table([slower]) and "6.540" in gate_table([result])
    # A reading without its IQR (saved before runs recorded one) is not a clock.
    without_iqr = Timing.from_saved({"median": 0.0064, "iqr": 0.0},
                                    {keys.DO_BENCH_MEDIAN_MS: 6.54})
    assert without_iqr.do_bench is None
    # Without do_bench, the drifting device clock alone cannot gate the case.
    no_do_bench = judge("x", Timing(base.median, base.iqr, base.run_medians, kind="wall",
                                    host_enqueue=0.0006, device_busy=base.device_busy),
                        same)
    assert no_do_bench.verdict is Verdict.TOO_NOISY


def test_repeats_keep_the_noisier_runs_do_bench_iqr() -> None:
    def run(iqr: float | None) -> dict:
        info = {keys.DO_BENCH_MEDIAN_MS: 7.0, keys.DO_BENCH_MEAN_MS: 7.0}
        if iqr is not None:
            info[keys.DO_BENCH_IQR_MS] = iqr
        return {"commit_info": {"id": "a"}, "machine_info": {"device_name": "GPU",
                                                             "gpu_count": 1},
                "benchmarks": [{"name": "c", "fullname": "t.py::c", "extra_info": info,
                                "stats": {"data": [1.0], "median": 1.0, "iterations": 1}}]}

    (bench,) = add_repeat(add_repeat(run(0.1), run(0.3)), run(0.2))["benchmarks"]
    assert bench["extra_info"][keys.DO_BENCH_IQR_MS] == 0.3
    (bench,) = add_repeat(run(0.1), run(None))["benchmarks"]
    assert keys.DO_BENCH_IQR_MS not in bench["extra_info"]


def test_each_run_is_judged_against_the_others_pooled(tmp_path, capsys) -> None:
    """Three unchanged runs, each of two parts: holding out any one raises no alarm; a run
    10% slower held out against the other two is caught."""
    def part(run: int, case: str, seconds: float) -> str:
        data = [seconds * (1 + 0.003 * i) for i in range(7)]
        q1, _, q3 = statistics.quantiles(data, n=4)
        saved = {"machine_info": {"device_name": "GPU", "gpu_count": 1},
                 "commit_info": {"id": "abc"}, "datetime": "2026-01-01T00:00:00",
                 "benchmarks": [{"name": case, "fullname": f"t.py::{case}",
                                 "extra_info": {keys.TIMING: "device"}, "params": {},
                                 "stats": {"median": statistics.median(data), "iqr": q3 - q1,
                                           "mean": statistics.fmean(data), "rounds": 7,
                                           "data": data, "iterations": 1}}]}
        path = tmp_path / f"run{run}_{case}.json"
        path.write_text(json.dumps(saved))
        return str(path)

    def runs(scale: list[float]) -> list[str]:
        return [f"{part(run, 'a', 0.010 * k)},{part(run, 'b', 0.020 * k)}"
                for run, k in enumerate(scale, 1)]

    unchanged = runs([1.0, 1.01, 0.995])
    for held_out in (1, 2, 3):
        assert baseline_main(["judge-held-out", str(held_out), *unchanged]) == 0
        table = capsys.readouterr().out
        pooled = "_".join(str(run) for run in (1, 2, 3) if run != held_out)
        # the table names what was judged against what, not a temporary folder
        assert f"- perf gate: held_out_run{held_out}.json vs runs_{pooled}_pooled/" in table
        assert "2 ok" in table
    assert baseline_main(["judge-held-out", "3", *runs([1.0, 1.01, 1.10])]) == 1
    assert "SLOWER" in capsys.readouterr().out
    assert baseline_main(["judge-held-out", "4", *unchanged]) == 2
    assert "hold out one of at least two runs" in capsys.readouterr().err
