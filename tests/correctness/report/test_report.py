"""The report's views of saved runs (newest results, two runs compared), from real smoke runs
and test fixtures."""

from __future__ import annotations

import copy
import json

import pytest

from systems.report.cli import main
from systems.report.compare import compare_runs
from systems.runs import keys
from systems.runs.baseline import run_timings
from systems.runs.gate import FLOOR, compare, regressions
from systems.runs.history import latest_results, load_run, load_runs

PNG = b"\x89PNG\r\n\x1a\n"


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


def test_combined_history_files_keep_the_source_run(smoke_runs, tmp_path) -> None:
    first = json.loads(sorted(smoke_runs.rglob("*.json"))[0].read_text())
    combined = copy.deepcopy(first)
    for bench in combined["benchmarks"]:
        bench["extra_info"]["source_run"] = "0001_original.json"
    path = tmp_path / "0003_combined.json"
    path.write_text(json.dumps(combined))
    assert {r.run for r in load_run(path).results} == {"0001_original.json"}


def test_latest_skips_a_malformed_history_with_one_warning(storage_with_a_bad_run,
                                                            capsys) -> None:
    storage, bad = storage_with_a_bad_run
    good = next(p for p in storage.rglob("*.json") if p != bad)
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


def test_report_help_shows_defaults(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert ("where run ids are looked up (default: .benchmarks)"
            in " ".join(capsys.readouterr().out.split()))
