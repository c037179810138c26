"""The one validator of saved runs (systems.runs.validate) and the readers that use it:
`baseline judge`, `report compare`, the results page of tools/docgen, study numbers, output
destinations."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from systems.report.cli import main as report_main
from systems.runs.baseline import json_destination_path, study_path
from systems.runs.baseline import main as baseline_main
from systems.runs.history import MalformedRunError, load_runs, read_run
from systems.runs.validate import run_problems
from tools.docgen.results_page import write_results_page


def a_run(median: float = 0.010, *, gpu: str = "GPU A", name: str = "c",
          **stats: object) -> dict:
    return {"machine_info": {"device_name": gpu, "gpu_count": 1},
            "commit_info": {"id": "abc1234"}, "datetime": "2026-01-01T00:00:00",
            "benchmarks": [{"name": name, "fullname": f"t.py::{name}", "params": {},
                            "extra_info": {"implementation": "x", "shape": [1, 8, 4]},
                            "stats": {"median": median, "iqr": 0.0002, "mean": median,
                                      "stddev": 0.0001, "rounds": 5, **stats}}]}


def write(path: Path, run: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run))
    return path


def without(run: dict, section: str, key: str) -> dict:
    run[section].pop(key)
    return run


BAD_RUNS = {
    "no median": lambda: _drop_stat("median"),
    "no iqr": lambda: _drop_stat("iqr"),
    "median 0": lambda: a_run(0.0),
    "NaN median": lambda: a_run(float("nan")),
    "infinite median": lambda: a_run(float("inf")),
    "NaN iqr": lambda: a_run(iqr=float("nan")),
    "negative iqr": lambda: a_run(iqr=-1.0),
    "no rounds": lambda: a_run(rounds=0),
    "NaN run median": lambda: _with_info(run_medians=[0.01, float("nan")]),
    "zero device round": lambda: _with_info(device_busy_s=[0.01, 0.0]),
    "no GPU model": lambda: without(a_run(), "machine_info", "device_name"),
    "no commit": lambda: without(a_run(), "commit_info", "id"),
}


def _drop_stat(key: str) -> dict:
    run = a_run()
    run["benchmarks"][0]["stats"].pop(key)
    return run


def _with_info(**info: object) -> dict:
    run = a_run()
    run["benchmarks"][0]["extra_info"].update(info)
    return run


@pytest.mark.parametrize("damage", BAD_RUNS)
def test_a_run_with_an_unusable_number_or_key_is_refused_naming_it(damage, tmp_path) -> None:
    path = write(tmp_path / "bad.json", BAD_RUNS[damage]())
    with pytest.raises(MalformedRunError, match="bad.json: not a usable benchmark run"):
        read_run(path)
    assert run_problems(a_run()) == []


def test_judge_tells_a_regression_from_an_unusable_input(tmp_path, capsys) -> None:
    base = write(tmp_path / "base.json", a_run())
    slow = write(tmp_path / "slow.json", a_run(0.013))
    assert baseline_main(["judge", str(slow), "--against", str(base)]) == 1
    assert "SLOWER" in capsys.readouterr().out
    for bad in (write(tmp_path / "nan.json", a_run(float("nan"))),
                write(tmp_path / "other_gpu.json", a_run(gpu="GPU B")),
                write(tmp_path / "renamed.json", a_run(name="d"))):
        assert baseline_main(["judge", str(bad), "--against", str(base)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith("error: ")
    (tmp_path / "truncated.json").write_text('{"benchmarks": [')
    assert baseline_main(["judge", str(slow), "--against",
                          str(tmp_path / "truncated.json")]) == 2


def test_report_compare_refuses_another_gpu_and_a_compare_of_nothing(tmp_path, capsys) -> None:
    old = write(tmp_path / "old.json", a_run())
    for new, why in ((a_run(gpu="GPU B"), "never compared"),
                     (a_run(name="d"), "no benchmark in common")):
        assert report_main(["compare", str(old), str(write(tmp_path / "new.json", new))]) == 2
        assert why in capsys.readouterr().err


def test_reports_skip_a_bad_file_with_one_warning(tmp_path, capsys) -> None:
    root = tmp_path / "histories"
    write(root / "GPU_A" / "0001_good.json", a_run())
    write(root / "GPU_A" / "0002_bad.json", a_run(float("nan")))
    runs = load_runs(root)
    assert [run.path.name for run in runs] == ["0001_good.json"]
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and "0002_bad.json" in warnings[0]


def test_results_page_with_no_runs_fails_and_writes_nothing(tmp_path) -> None:
    out = tmp_path / "docs" / "RESULTS.md"
    for root in (tmp_path / "absent", tmp_path / "empty"):
        with pytest.raises(ValueError, match="no usable saved runs"):
            write_results_page(root, out)
    assert not out.exists() and not out.parent.exists()


def test_results_page_checks_its_destination_before_any_work(tmp_path) -> None:
    root = tmp_path / "histories"
    write(root / "GPU_A" / "0001_good.json", a_run())
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")
    with pytest.raises(OSError, match=f"cannot write in {blocker}"):
        write_results_page(root, blocker / "RESULTS.md")


def test_study_numbers_are_reserved_so_concurrent_sessions_never_share_one(tmp_path) -> None:
    taken: list[Path] = []
    start = threading.Barrier(8)

    def reserve() -> None:
        start.wait()
        taken.append(study_path(tmp_path, "same"))

    threads = [threading.Thread(target=reserve) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(taken)) == 8 and all(path.is_file() for path in taken)
    assert sorted(p.name for p in taken)[-1] == "0008_same.json"


def test_a_json_destination_given_as_a_path_keeps_its_folder(tmp_path) -> None:
    # pytest-benchmark 5.3 hands --benchmark-json over as a Path, whose `.name` is only
    # the file's name: the folder checked must be the path's own.
    assert json_destination_path(tmp_path / "out" / "run.json") == tmp_path / "out" / "run.json"
    assert json_destination_path(str(tmp_path / "run.json")) == tmp_path / "run.json"
