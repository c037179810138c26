"""The blocks every study shares: `ratios` (per workload, each implementation's time and
its ratio to one of them) and `history` (one row per run), over any saved run's layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.docgen.doc_blocks import BlockError, render
from tools.docgen.doc_sources import generators

CLOCK = "clock='device time'"


def _run(tmp_path: Path, rows: list[dict], name: str = "run.json") -> str:
    (tmp_path / name).write_text(json.dumps({"device": "GPU", "torch": "2", "commit": "abc",
                                             "rows": rows}))
    return name


def _block(tmp_path: Path, spec: str) -> list[str]:
    text = render(f"<!-- generated: {spec} -->\n<!-- end generated -->\n", generators(tmp_path))
    return text.splitlines()


def test_rounds_taken_in_turn_give_the_median_of_the_per_round_ratios(tmp_path):
    run = _run(tmp_path, [{"shape": [1, 4096, 64], "wrong": [], "ms_per_round": {
        "library": [1.0, 4.0, 3.0], "SDPA cuDNN": [2.0, 4.0, 2.0]}}])
    lines = _block(tmp_path, f"ratios {run} against='SDPA cuDNN' layout=wide {CLOCK}")
    assert lines[1] == "| workload | SDPA cuDNN ms | library / SDPA cuDNN |"
    assert lines[3] == "| 1x4096x64 | 2.000 | 1.000 (0.500–1.500) |"
    assert "Time: device time;" in lines[-2] and "`run.json` (GPU, torch 2; commit abc)" \
        in lines[-2]


def test_rows_of_one_time_each_are_told_apart_by_the_config_that_differs(tmp_path):
    shape = {"batch": 16, "seq": 4096, "head_dim": 64}
    run = _run(tmp_path, [
        {**shape, "kind": "cudnn", "backward_ms": 2.0},
        {**shape, "kind": "gluon", "config": {"ordered": True, "writers": 1}, "backward_ms": 3.0},
        {**shape, "kind": "gluon", "config": {"ordered": True, "writers": 2}, "backward_ms": 2.5},
        {**shape, "kind": "gluon", "config": {"ordered": False, "writers": 1},
         "backward_ms": 1.0}])
    lines = _block(tmp_path, f"ratios {run} against=cudnn {CLOCK}")
    assert "| 16x4096x64 | gluon (ordered=True, writers=2) | 2.500 | 1.250 |" in lines
    assert "| 16x4096x64 | cudnn | 2.000 | 1 |" in lines
    fastest = _block(tmp_path, f"ratios {run} against=cudnn fastest=ordered {CLOCK}")
    assert "| 16x4096x64 | gluon (ordered=True) | 2.500 | 1.250 |" in fastest
    assert "| 16x4096x64 | gluon (ordered=False) | 1.000 | 0.500 |" in fastest
    narrowed = _block(tmp_path, f"ratios {run} against=cudnn where=ordered:False {CLOCK}")
    assert [line.split("|")[2].strip() for line in narrowed[3:5]] == ["cudnn", "gluon"]


def test_a_ratio_the_run_stored_is_taken_as_stored(tmp_path):
    run = _run(tmp_path, [{"seq": 512, "head_dim": 64, "tokens": 32768, "matrices": 64,
                           "ms": {"default": 2.0, "pair": 1.0},
                           "over_default": {"default": 1.0, "pair": 0.45}}])
    lines = _block(tmp_path, f"ratios {run} against=default layout=wide {CLOCK}")
    assert lines[3] == "| 64x512x64 | 2.000 | 0.450 |"


def test_a_check_that_failed_is_named(tmp_path):
    run = _run(tmp_path, [{"shape": [1, 4096, 64], "wrong": ["library"],
                           "ms_per_round": {"library": [1.0], "SDPA cuDNN": [1.0]}}])
    text = "\n".join(_block(tmp_path, f"ratios {run} against='SDPA cuDNN' {CLOCK}"))
    assert "outputs DIFFERED at 1x4096x64" in text


def _history(tmp_path: Path, name: str, commit: str, ours: list[float]) -> str:
    case = {"name": "test_attention_table[triton-1x16x4096x64]", "fullname": "x",
            "stats": {"median": 1e-3, "mean": 1e-3, "iqr": 0.0, "rounds": 3, "min": 1e-3,
                      "max": 1e-3, "stddev": 0.0},
            "extra_info": {"implementation": "triton", "shape": [1, 16, 4096, 64],
                           "interleaved_device_ms": {"triton": ours, "fa4": [1.0, 1.0, 1.0]}}}
    (tmp_path / name).write_text(json.dumps({
        "machine_info": {"device_name": "GPU"}, "datetime": "2026-11-28T00:00:00",
        "commit_info": {"id": commit}, "benchmarks": [case]}))
    return name


def test_history_gives_each_run_its_ratio_per_workload(tmp_path):
    old = _history(tmp_path, "old.json", "aaaaaaa1", [1.2, 1.3, 1.1])
    new = _history(tmp_path, "new.json", "bbbbbbb2", [1.0, 1.1, 1.05])
    lines = _block(tmp_path, f"history {old} {new} ours=ours against=fa4 {CLOCK}")
    assert lines[1] == "| GPU | commit | recorded | 16x4096x64 |"
    assert lines[3:5] == ["| GPU | aaaaaaa | 2026-11-28 | 1.200 |",
                          "| GPU | bbbbbbb | 2026-11-28 | 1.050 |"]


@pytest.mark.parametrize("spec", ["ratios run.json against=cudnn",  # no clock
                                  f"ratios against=cudnn {CLOCK}",  # no file
                                  f"ratios run.json against=cudnn colour=red {CLOCK}",
                                  f"ratios run.json against=cudnn where=kind:none {CLOCK}",
                                  f"history run.json ours=gluon against=cudnn {CLOCK}"])
def test_a_block_that_cannot_be_filled_is_an_error(tmp_path, spec):
    _run(tmp_path, [{"batch": 1, "seq": 2, "head_dim": 3, "kind": "cudnn", "backward_ms": 1.0}])
    with pytest.raises(BlockError):
        _block(tmp_path, spec)


def _recipe(recipe: str, median: float, attention: str | None = None) -> dict:
    info = {"size": "2.7b", "seq_len": 512, "mode": "train_step", "recipe": recipe,
            "flops": 40e12 * median, **({"attention": attention} if attention else {})}
    return {"name": f"test_training_recipe[2.7b-{recipe}-{attention}]", "fullname": "x",
            "stats": {"median": median, "mean": median, "iqr": 0.0, "rounds": 5,
                      "min": median * 0.9, "max": median * 1.1, "stddev": 0.0},
            "extra_info": info}


def test_recipe_steps_give_their_ratio_flop_rate_and_rounds(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({
        "machine_info": {"device_name": "GPU"}, "datetime": "2026-11-28T00:00:00",
        "commit_info": {"id": "abc1234"}, "benchmarks": [
            _recipe("optimized", 0.100), _recipe("pytorch_baseline", 0.125),
            _recipe("optimized", 0.110, attention="triton_two_pass")]}))
    wide = _block(tmp_path, f"ratios run.json ours=optimized layout=wide rate=yes "
                  f"time=median where=recipe:optimized|pytorch_baseline {CLOCK}")
    assert wide[1].startswith("| workload | optimized ms | optimized / pytorch_baseline |")
    assert "| 2.7b, ctx 512 | 100.000 | 0.800 | 0.909 | 40 | 5.4% |" in wide  # 4 TFLOP in 0.1 s
    long = _block(tmp_path, f"ratios run.json against=optimized time=median {CLOCK}")
    assert ("| 2.7b, ctx 512 | optimized, triton_two_pass attention | 110.000 | 99.0–121.0 | "
            "1.100 |") in long


def test_runs_of_one_commit_are_told_apart_by_file(tmp_path):
    rows = [{"batch": 1, "seq": 2, "head_dim": 3, "kind": kind, "backward_ms": ms}
            for kind, ms in (("cudnn", 1.0), ("gluon", 0.5))]
    for name in ("a.json", "b.json"):
        _run(tmp_path, rows, name)
    lines = _block(tmp_path, f"ratios a.json b.json against=cudnn layout=wide {CLOCK}")
    assert [line.split("|")[1].strip() for line in lines[3:5]] == ["1x2x3 (a)", "1x2x3 (b)"]
