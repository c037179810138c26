"""Report pages, tables, plots and the compare view, from real smoke runs and test fixtures."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from smoke_runs import save_smoke_runs

from systems.report.cli import main
from systems.report.compare import compare_runs
from systems.report.plots import allreduce_bandwidth, ddp_variants
from systems.report.tables import ddp_table, recipes_table
from systems.runs import keys
from systems.runs.baseline import run_timings
from systems.runs.gate import FLOOR, compare, regressions
from systems.runs.history import Result, latest_results, load_run, load_runs

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> Path:
    """Two real smoke runs saved by pytest-benchmark: fp32 and bf16 forward, then fp32 again
    (the fast cases, to keep this file quick)."""
    storage = tmp_path_factory.mktemp("benchmarks")
    save_smoke_runs(storage, [("first", "tiny-ctx64-forward-"), ("second", "forward-fp32")])
    return storage


def test_latest_results_take_each_benchmark_from_the_newest_run(smoke_runs) -> None:
    runs = load_runs(smoke_runs)
    assert [r.path.name[5:] for r in runs] == ["first.json", "second.json"]
    assert (len(runs[0].results), len(runs[1].results)) == (2, 1)
    latest = {r.get("precision"): r.run for r in latest_results(runs)}
    assert latest == {"fp32": runs[1].path.name, "bf16": runs[0].path.name}


def test_runs_with_an_injected_slowdown_never_reach_a_report(smoke_runs, tmp_path) -> None:
    # A newer copy of a real run with a case slowed down on purpose (the gate's test switch)
    # must not become "the newest result" of anything, not even through its other cases.
    newest = max(smoke_runs.rglob("*.json"))
    slowed = json.loads(newest.read_text())
    slowed["benchmarks"][0]["extra_info"]["injected_slowdown"] = 0.15
    slowed["datetime"] = "2999-01-01T00:00:00"
    copy_root = tmp_path / "benchmarks"
    (copy_root / "gpu").mkdir(parents=True)
    for path in smoke_runs.rglob("*.json"):
        (copy_root / "gpu" / path.name).write_text(path.read_text())
    (copy_root / "gpu" / "9999_slowed.json").write_text(json.dumps(slowed))
    runs = load_runs(copy_root)
    assert [len(r.results) for r in runs if r.path.name == "9999_slowed.json"] == [0]
    assert all(r.file != "gpu/9999_slowed.json" for r in latest_results(runs))


def test_results_command_writes_page_and_plots(smoke_runs, tmp_path) -> None:
    out = tmp_path / "docs" / "RESULTS.md"
    assert main(["results", "--root", str(smoke_runs), "--out", str(out),
                 "--include-cpu"]) == 0
    page = out.read_text()
    assert "Model step time by size" in page
    assert "systems report latest --gpu" in page  # every case's newest result is there
    assert "### Attention" not in page  # no attention results, no section
    images = [line.split("(")[1].rstrip(")") for line in page.splitlines()
              if line.startswith("![")]
    assert images and all((out.parent / i).read_bytes()[:8] == PNG for i in images)
    # CPU runs are left out unless asked for: with nothing else, there is nothing to report.
    assert main(["results", "--root", str(smoke_runs), "--out", str(out)]) == 2


def test_latest_command_names_the_run_file(smoke_runs, capsys) -> None:
    assert main(["latest", "--root", str(smoke_runs), "--gpu", "cpu"]) == 0
    assert "_second.json" in capsys.readouterr().out
    assert main(["latest", "--root", str(smoke_runs), "--gpu", "no-such-gpu"]) == 2
    capsys.readouterr()
    assert main(["latest", "--root", str(smoke_runs), "--device", "cpu"]) == 0  # old spelling
    assert "_second.json" in capsys.readouterr().out


def _as_gpu_run(run: dict) -> dict:
    """A copy of a CPU smoke run whose rounds read as device-timed GPU work, so that the
    gate's judgement (which leaves host-bound CPU rounds unjudged) applies to it."""
    run = copy.deepcopy(run)
    for bench in run["benchmarks"]:
        bench["extra_info"].update({keys.TIMING: "device", keys.TORCH_DEVICE: "cuda"})
        bench["stats"]["iqr"] = bench["stats"]["median"] * 0.01
    return run


def test_compare_judges_as_the_gate_does(smoke_runs, tmp_path, capsys) -> None:
    first = sorted(smoke_runs.rglob("*.json"))[0]
    base = _as_gpu_run(json.loads(first.read_text()))
    slower = copy.deepcopy(base)
    changed = slower["benchmarks"][0]
    changed["stats"]["median"] *= 3  # a fixture: the same run with one benchmark made slower
    paths = []
    for name, run in (("0008_base.json", base), ("0009_slower.json", slower)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(run))
    old, new = (load_run(p) for p in paths)
    text = compare_runs(old, new)
    row = next(line for line in text.splitlines() if f"| {changed['name']} |" in line)
    assert "**slower**" in row and "+200.0%" in row and f"| {FLOOR:.1%} |" in row
    assert text.count("**slower**") == 1 and text.count("| ok |") == len(base["benchmarks"]) - 1
    gate = compare(run_timings(base), run_timings(slower))
    assert [c.name for c in regressions(gate)] == [changed["fullname"]]  # one verdict
    assert main(["compare", *map(str, paths)]) == 0 and "**slower**" in capsys.readouterr().out


def test_compare_leaves_host_bound_cases_unjudged(smoke_runs) -> None:
    first = sorted(smoke_runs.rglob("*.json"))[0]
    text = compare_runs(load_run(first), load_run(first))
    row = next(line for line in text.splitlines() if "tiny-ctx64-forward-" in line)
    assert "not gated (host-bound: runs on the CPU)" in row
    assert row.endswith("| eager end-to-end (host included) |")  # what a round measured


# -------------------------------------------- other suites' results, as synthetic fixtures
def _result(name: str, mean: float, **info) -> Result:
    return Result(name=name, fullname=f"tests/perf/x.py::{name}", group=None,
                  stats={"mean": mean, "stddev": mean / 50}, info=info, run="0001_fixture.json",
                  datetime="2026-01-01", device="GPU fixture")


def test_recipes_table_puts_the_three_recipes_side_by_side() -> None:
    def recipe(name: str, size: str, mean: float) -> Result:
        return _result(f"recipe-{size}-{name}", mean, size=size, seq_len=512,
                       mode="train_step", recipe=name, cold_start_s=mean * 100, mfu=0.25)

    results = [recipe("eager", "2.7b", 0.3), recipe("pytorch_baseline", "2.7b", 0.15),
               recipe("optimized", "2.7b", 0.12), recipe("optimized", "small", 0.05)]
    assert {r.kind for r in results} == {"recipe"}
    rows = recipes_table(results).splitlines()[2:]
    assert len(rows) == 2 and rows[0].startswith("| small") and rows[1].startswith("| 2.7b")
    # 2.7b: 150 / 120 ms against the baseline, 300 / 120 against eager; cold 15 s and 12 s.
    assert "| 1.25x | 2.50x | 25.0% | 15.0 | 12.0 |" in rows[1]
    assert "| - | - | 25.0% | - | 5.0 |" in rows[0]  # small: ours alone


def test_distributed_sections_render_only_with_data(tmp_path) -> None:
    assert ddp_variants([], tmp_path / "d.png") is None
    assert allreduce_bandwidth([], tmp_path / "b.png") is None
    ddp = [_result("none", 0.5, variant="none", world_size=2, **{keys.STEP_S: 0.4}),
           _result("naive", 0.5, variant="naive", world_size=2, **{keys.STEP_S: 0.45}),
           _result("saved", 0.5, variant="flat", world_size=4,  # no "none" at world size 4
                   **{keys.STEP_S: 0.45, keys.OVERHEAD_VS_NO_COMM: 0.25}),
           *(_result(f"bucketed{mb}", 0.4 + mb / 1e4, variant="bucketed", world_size=2,
                     **{keys.BUCKET_SIZE_MB: mb, keys.STEP_S: 0.4}) for mb in (1, 10, 100))]
    collectives = [_result(f"ar{s}", 1e-5 + s / 100e9, backend="nccl", world_size=2,
                           size_bytes=s, **{keys.ALGBW: s / (1e-5 + s / 100e9) / 1e9})
                   for s in (10**4, 10**6, 10**8)]
    table = ddp_table(ddp)
    assert len(table.splitlines()) == 8
    assert "| naive | - | 2 | - | 450.0 | +12.5% |" in table  # against "none" of its run
    assert "| flat | - | 4 | - | 450.0 | +25.0% |" in table  # as an older run saved it
    assert ddp_variants(ddp, tmp_path / "d.png").read_bytes()[:8] == PNG
    assert allreduce_bandwidth(collectives, tmp_path / "b.png").read_bytes()[:8] == PNG


def test_real_distributed_run_lands_in_the_distributed_tables(tmp_path) -> None:
    save_smoke_runs(tmp_path, [("dist", "world2")], module="tests/perf/test_distributed.py")
    results = latest_results(load_runs(tmp_path))
    kinds = {r.name: r.kind for r in results}
    assert set(kinds.values()) == {"ddp", "collective"}
    train_steps = [name for name in kinds if name.startswith("test_train_step")]
    table = ddp_table(results)
    assert len(table.splitlines()) == 2 + len(train_steps)
    assert "| - | - |" not in table  # step time and overhead are read from extra_info


def test_combined_history_files_keep_the_source_run(smoke_runs, tmp_path) -> None:
    first = json.loads(sorted(smoke_runs.rglob("*.json"))[0].read_text())
    combined = copy.deepcopy(first)
    for bench in combined["benchmarks"]:
        bench["extra_info"]["source_run"] = "0001_original.json"
    path = tmp_path / "0003_combined.json"
    path.write_text(json.dumps(combined))
    assert {r.run for r in load_run(path).results} == {"0001_original.json"}


# ------------------------------------------------------------- malformed history files
_CORRUPTIONS = {
    "truncated": lambda text: text[: len(text) // 2],
    "a list, not a run": lambda text: json.dumps([json.loads(text)]),
    "benchmarks not a list": lambda text: json.dumps({**json.loads(text), "benchmarks": {}}),
    "a benchmark without stats": lambda text: json.dumps(
        {**json.loads(text),
         "benchmarks": [{k: v for k, v in b.items() if k != "stats"}
                        for b in json.loads(text)["benchmarks"]]}),
    "stats without a mean": lambda text: json.dumps(
        {**json.loads(text),
         "benchmarks": [{**b, "stats": {"min": 1.0}} for b in json.loads(text)["benchmarks"]]}),
    "machine_info not a mapping": lambda text: json.dumps(
        {**json.loads(text), "machine_info": "H100"}),
}


@pytest.fixture(params=sorted(_CORRUPTIONS))
def storage_with_a_bad_run(request, smoke_runs, tmp_path) -> tuple[Path, Path]:
    """A copy of the smoke storage where the second run is corrupted one way."""
    storage = tmp_path / "benchmarks"
    for path in smoke_runs.rglob("*.json"):
        target = storage / path.relative_to(smoke_runs)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    bad = sorted(storage.rglob("*.json"))[-1]
    bad.write_text(_CORRUPTIONS[request.param](bad.read_text()))
    return storage, bad


def test_report_commands_skip_a_malformed_history_with_one_warning(
        storage_with_a_bad_run, tmp_path, capsys) -> None:
    storage, bad = storage_with_a_bad_run
    good = next(p for p in storage.rglob("*.json") if p != bad)
    out = tmp_path / "docs" / "RESULTS.md"
    assert main(["results", "--root", str(storage), "--out", str(out), "--include-cpu"]) == 0
    err = capsys.readouterr().err
    assert err.count(str(bad)) == 1 and "skipping" in err
    page = out.read_text()
    runs = sum(1 for p in storage.rglob("*.json") if p != bad)
    assert f"{runs} saved runs" in page and bad.name not in page
    assert main(["latest", "--root", str(storage), "--gpu", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count(str(bad)) == 1 and good.name in captured.out


def test_compare_names_a_malformed_history(storage_with_a_bad_run, capsys) -> None:
    storage, bad = storage_with_a_bad_run
    good = next(p for p in storage.rglob("*.json") if p != bad)
    assert main(["compare", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err


def test_compare_takes_run_ids_like_pytest_benchmark(smoke_runs, tmp_path, capsys) -> None:
    first, second = sorted(smoke_runs.rglob("*.json"))
    # Storage of two GPUs: the same ids exist in both, so the GPU must be named.
    root = tmp_path / "benchmarks"
    for gpu in ("NVIDIA_H100", "NVIDIA_H200"):
        for path in (first, second):
            target = root / gpu / "machine" / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    number = first.name[:4]
    assert main(["compare", number, second.stem, "--root", str(root), "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# {first.name} -> {second.name}")
    assert main(["compare", number, second.stem, "--root", str(root)]) == 2
    assert "ambiguous" in capsys.readouterr().err
    assert main(["compare", "0099", number, "--root", str(root), "--gpu", "h100"]) == 2
    assert "0099: no such file, and no run with that id" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "shown"), [
    ("results", "--root ROOT histories, searched at any depth (default: .benchmarks)"),
    ("results", "the page (default: docs/RESULTS.md)"),
    ("compare", "where run ids are looked up (default: .benchmarks)"),
])
def test_report_help_shows_defaults(command: str, shown: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert shown in " ".join(capsys.readouterr().out.split())
