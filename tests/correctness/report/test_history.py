"""Combining saved benchmark runs into one history file."""

from __future__ import annotations

import json

import pytest
from smoke_runs import save_smoke_runs

from systems.runs.combine import combine_runs, main, next_run_path


@pytest.fixture(scope="module")
def two_real_runs(tmp_path_factory):
    """Two real smoke runs of different perf cases, saved by pytest-benchmark itself."""
    storage = tmp_path_factory.mktemp("bench")
    save_smoke_runs(storage, [("fwd", "forward-fp32"), ("train", "train_step-fp32-eager")])
    (machine_dir,) = storage.iterdir()
    return sorted(machine_dir.glob("*.json"))


def test_combined_run_holds_every_benchmark_with_its_source(two_real_runs) -> None:
    first, second = two_real_runs
    combined = combine_runs([first, second])
    names = {b["fullname"]: b["extra_info"]["source_run"] for b in combined["benchmarks"]}
    assert len(names) == 2
    assert sorted(names.values()) == sorted([first.name, second.name])
    assert combined["combined_from"] == [first.name, second.name]


def test_cli_writes_the_next_numbered_file(two_real_runs, capsys) -> None:
    assert main([str(p) for p in two_real_runs] + ["--name", "all"]) == 0
    target = two_real_runs[0].parent / "0003_all.json"
    assert target.exists() and "0003_all.json" in capsys.readouterr().out
    assert len(json.loads(target.read_text())["benchmarks"]) == 2
    assert next_run_path(target.parent, "x").name == "0004_x.json"


def test_runs_of_different_devices_are_refused(two_real_runs, tmp_path) -> None:
    other = json.loads(two_real_runs[0].read_text())
    other["machine_info"]["device_name"] = "NVIDIA H200"
    path = tmp_path / "0001_other.json"
    path.write_text(json.dumps(other))
    with pytest.raises(ValueError, match="different devices"):
        combine_runs([two_real_runs[1], path])


@pytest.mark.parametrize("damage", ["truncated", "wrong shape", "missing keys"])
def test_cli_names_a_malformed_run(two_real_runs, tmp_path, damage, capsys) -> None:
    text = two_real_runs[0].read_text()
    bad = tmp_path / "0001_bad.json"
    bad.write_text({"truncated": text[: len(text) // 2],
                    "wrong shape": json.dumps([json.loads(text)]),
                    "missing keys": json.dumps({"machine_info": {}})}[damage])
    assert main([str(two_real_runs[1]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and err.startswith("error:")
    assert not list(tmp_path.glob("0002_*.json"))  # nothing written
