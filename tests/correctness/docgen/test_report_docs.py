"""Numbers in prose docs are generated: the committed docs' generated blocks equal what the
report writes now from the committed histories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.docgen import doc_sources
from tools.docgen.__main__ import default_docs, main
from tools.docgen.doc_blocks import BlockError, render
from tools.docgen.doc_sources import generators
from tools.docgen.results_page import write_results_page

REPO = Path(__file__).resolve().parents[3]
COMMITTED_DOCS = default_docs(REPO)


def _first_difference(old: str, new: str) -> str:
    for number, (a, b) in enumerate(zip(old.splitlines(), new.splitlines(), strict=False), 1):
        if a != b:
            return f"line {number}:\n  committed: {a}\n  generated: {b}"
    return "line count differs"


def test_the_docs_that_are_checked_include_the_prose_docs() -> None:
    names = {p.relative_to(REPO).as_posix() for p in COMMITTED_DOCS}
    assert {"README.md", "docs/attention.md", "docs/benchmarking.md"} <= names
    assert "docs/RESULTS.md" not in names  # the page is generated whole
    studies = {p.name for p in (REPO / "studies").iterdir()
               if p.is_dir() and not p.name.startswith(("_", "."))}
    assert {f"studies/{name}/README.md" for name in studies} <= names  # every study's log


@pytest.mark.parametrize("doc", COMMITTED_DOCS,
                         ids=lambda p: p.relative_to(REPO).as_posix())
def test_committed_generated_blocks_are_what_the_report_writes_now(doc: Path) -> None:
    text = doc.read_text()
    generated = render(text, generators(REPO), str(doc))
    assert generated == text, (
        f"{doc.relative_to(REPO)}: a generated block was edited by hand or is stale; run "
        f"`make report` and commit. First difference at {_first_difference(text, generated)}")


def test_attention_doc_takes_its_numbers_from_the_baseline() -> None:
    text = (REPO / "docs" / "attention.md").read_text()
    baseline = ".benchmarks/NVIDIA_H100_80GB_HBM3/baseline_1gpu.json"
    assert f"<!-- generated: ratios {baseline} " in text
    assert f"From `{baseline}` (NVIDIA H100 80GB HBM3; commit " in text
    for clock in ("eager end-to-end (host included)", "device time (CUDA-graph replay)",
                  "device time (do_bench"):
        assert f"Time: {clock}" in text


# A fixture repository: one history, one doc.

def _bench(name: str, impl: str, median: float, shape: list[int], mean: float | None = None,
           **extra: object) -> dict:
    return {"name": name, "fullname": f"tests/perf/test_attention.py::{name}",
            "stats": {"mean": mean or median, "median": median, "stddev": median / 20,
                      "iqr": median / 10, "rounds": 10},
            "extra_info": {"implementation": impl, "shape": shape, "dtype": "bfloat16",
                           "causal": True, "mode": "forward_backward", **extra}}


def _write_history(repo: Path, ours_median: float = 0.002) -> str:
    name = "hist/GPU/baseline.json"
    path = repo / name
    path.parent.mkdir(parents=True, exist_ok=True)
    benchmarks = [
        # Means far from the medians: every number shown must be a median.
        _bench("test_attention[triton-1x1x4096x64]", "triton", ours_median, [1, 1, 4096, 64],
               mean=0.05, interleaved_medians_s={"triton": 0.0021, "sdpa_flash": 0.0042,
                                                 "sdpa_cudnn": 0.0007},
               interleaved_rounds=30),
        _bench("test_attention[sdpa_flash-1x1x4096x64]", "sdpa_flash", 0.004,
               [1, 1, 4096, 64], mean=0.05),
        _bench("test_attention[sdpa_cudnn-1x1x4096x64]", "sdpa_cudnn", 0.001,
               [1, 1, 4096, 64]),
        _bench("test_attention[sdpa_flash-1x1x8192x64]", "sdpa_flash", 0.009,
               [1, 1, 8192, 64]),  # no ours at this shape: no row
        _bench("test_attention_device_time[triton-1x1x4096x64]", "triton", 0.0005,
               [1, 1, 4096, 64], mode="forward_backward (CUDA graph replay)"),
        _bench("test_attention_device_time[sdpa_flash-1x1x4096x64]", "sdpa_flash", 0.0004,
               [1, 1, 4096, 64], mode="forward_backward (CUDA graph replay)"),
    ]
    path.write_text(json.dumps({
        "machine_info": {"device_name": "GPU fixture"}, "datetime": "2026-11-22T01:02:03",
        "commit_info": {"id": "abcdef0123456789", "dirty": False}, "benchmarks": benchmarks}))
    return name


WIDE = "ratios {history} ours=triton layout=wide time=median"
DOC = f"""# Notes

Prose stays as it is.

<!-- generated: {WIDE} where=test:test_attention clock=eager -->
stale text
<!-- end generated -->

Between blocks.

<!-- generated: {WIDE} where=test:test_attention_device_time clock='device time (graphs)' -->
<!-- end generated -->
"""


def _ratios(tmp_path: Path, history: str, options: str) -> str:
    return render(f"<!-- generated: ratios {history} {options} clock=c -->\n"
                  "<!-- end generated -->\n", generators(tmp_path))


def test_blocks_are_filled_from_the_history_with_medians_time_kind_file_and_commit(
        tmp_path: Path) -> None:
    history = _write_history(tmp_path)
    out = render(DOC.format(history=history), generators(tmp_path))
    assert out.startswith("# Notes\n\nProse stays as it is.\n\n<!-- generated: ratios")
    assert "stale text" not in out and "Between blocks." in out
    eager, device = out.split("Between blocks.")
    assert "| workload | triton ms | triton / sdpa_flash | triton / sdpa_cudnn |" in eager
    assert "| 1x4096x64 | 2.000 | 0.500 | 2.000 |" in eager
    assert "8192" not in eager  # a shape we did not measure is no claim of ours
    assert ("Time: eager; ms: the median" in eager and f"From `{history}` (GPU fixture; "
            "commit abcdef0, recorded 2026-11-22).") in eager
    assert "| 1x4096x64 | 0.500 | 1.250 |" in device
    assert render(out, generators(tmp_path)) == out  # rewriting is stable


def test_rounds_taken_in_turn_are_read_from_a_history(tmp_path: Path) -> None:
    """Eager medians taken in turn, and device-time rounds taken in turn, whose ratio is
    the median of the per-round ratios (not the medians' ratio)."""
    history = _write_history(tmp_path)
    eager = _ratios(tmp_path, history, "ours=ours layout=wide time=eager_in_turn")
    assert "| 1x4096x64 | triton | 2.100 | 0.500 | 3.000 |" in eager
    name = "hist/GPU/in_turn.json"
    (tmp_path / name).write_text(json.dumps({
        "machine_info": {"device_name": "GPU fixture"}, "datetime": "2026-11-22T01:02:03",
        "commit_info": {"id": "abcdef0123456789"}, "benchmarks": [_bench(
            "test_attention[triton_gluon_bwd]", "triton_gluon_bwd", 0.007, [16, 1, 16384, 128],
            # Per round 0.9, 1.0, 1.2: median 1.0; the medians' ratio 7.2 / 7.0 is not it.
            interleaved_device_ms={"triton_gluon_bwd": [6.3, 7.2, 8.4],
                                   "sdpa_cudnn": [7.0, 7.2, 7.0], "fa4": [7.0, 7.2, 7.0]})]}))
    device = _ratios(tmp_path, name, "ours=ours layout=wide")
    assert ("| 16x16384x128 | triton_gluon_bwd | 7.200 | 1.000 (0.900–1.200) | "
            "1.000 (0.900–1.200) |") in device


def test_do_bench_medians_and_several_times_in_one_table(tmp_path: Path) -> None:
    wide = [16, 1, 16384, 128]
    benchmarks = [_bench(f"test_attention[{impl}]", impl, seconds, wide, do_bench_median_ms=ms)
                  for impl, seconds, ms in (("triton", 0.0090, 7.0), ("sdpa_cudnn", 0.0095, 7.5),
                                            ("triton_gluon_bwd", 0.0093, 7.2))]
    (tmp_path / "run.json").write_text(json.dumps({
        "machine_info": {"device_name": "GPU fixture"}, "datetime": "2026-11-25T01:02:03",
        "commit_info": {"id": "fedcba9876543210"}, "benchmarks": benchmarks}))
    out = _ratios(tmp_path, "run.json", "against=sdpa_cudnn layout=wide time=median,do_bench")
    assert "| workload | variant | sdpa_cudnn ms | triton / sdpa_cudnn |" in out
    assert "| 16x16384x128 | do_bench | 7.500 | 0.933 | 0.960 |" in out
    assert "| 16x16384x128 | median | 9.500 | 0.947 | 0.979 |" in out


def test_a_ratio_of_a_host_bound_case_is_marked(tmp_path: Path) -> None:
    """Medians of host-bound eager cases time the host at two moments: their ratio is
    marked, whichever side was host-bound."""
    def case(impl: str, seq: int, enqueue: float) -> dict:
        return _bench(f"test_attention[{impl}-1x1x{seq}x64]", impl,
                      0.0005 if impl == "triton" else 0.0006, [1, 1, seq, 64],
                      timing="wall", host_enqueue_s_median=enqueue)

    (tmp_path / "run.json").write_text(json.dumps({
        "machine_info": {"device_name": "GPU fixture"}, "datetime": "2026-11-22T01:02:03",
        "commit_info": {"id": "abcdef0123456789"}, "benchmarks": [
            case("triton", 1024, 0.00049), case("sdpa_flash", 1024, 0.0001),
            case("triton", 2048, 0.0001), case("sdpa_flash", 2048, 0.00058),
            case("triton", 4096, 0.0001), case("sdpa_flash", 4096, 0.0001)]}))
    out = _ratios(tmp_path, "run.json", "ours=triton layout=wide time=median")
    assert "| 1x1024x64 | 0.500 | 0.833 † |" in out
    assert "| 1x2048x64 | 0.500 | 0.833 † |" in out
    assert "| 1x4096x64 | 0.500 | 0.833 |" in out
    assert "† host-bound: one side spent 90% or more of each round enqueueing" in out


def test_a_hand_edit_or_a_new_measurement_makes_the_doc_differ(tmp_path: Path) -> None:
    history = _write_history(tmp_path)
    committed = render(DOC.format(history=history), generators(tmp_path))
    edited = committed.replace("| 2.000 |", "| 1.500 |")
    assert edited != committed and render(edited, generators(tmp_path)) == committed
    _write_history(tmp_path, ours_median=0.003)  # the baseline is re-recorded
    regenerated = render(committed, generators(tmp_path))
    assert regenerated != committed and "| 3.000 |" in regenerated


def test_the_doc_generator_rewrites_the_docs_blocks(tmp_path: Path) -> None:
    history = _write_history(tmp_path)
    docs = tmp_path / "docs"
    docs.mkdir()
    note = docs / "notes.md"
    note.write_text(DOC.format(history=history))
    (tmp_path / "README.md").write_text("No blocks here.\n")
    page = docs / "RESULTS.md"
    write_results_page(tmp_path / "hist", page)
    assert main(["--repo", str(tmp_path)]) == 0
    assert "| 2.000 | 0.500 |" in note.read_text()
    assert (tmp_path / "README.md").read_text() == "No blocks here.\n"
    assert default_docs(tmp_path) == [tmp_path / "README.md", note]


def test_the_doc_generator_writes_the_results_page_first_when_asked(tmp_path: Path) -> None:
    history = tmp_path / _write_history(tmp_path)
    (tmp_path / ".benchmarks").mkdir()
    history.rename(tmp_path / ".benchmarks" / history.name)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("No blocks here.\n")
    assert main(["--results", "--repo", str(tmp_path)]) == 0
    page = (tmp_path / "docs" / "RESULTS.md").read_text()
    assert "Generated by `python -m tools.docgen --results`" in page and "## GPU fixture" in page
    assert main(["--results", "--repo", str(tmp_path / "empty")]) == 2  # no histories


@pytest.mark.parametrize(("text", "why"), [
    ("<!-- generated: nonesuch -->\n<!-- end generated -->\n", "no generator named 'nonesuch'"),
    ("<!-- generated: gate-constants -->\nbody\n", "never closed"),
    ("text\n<!-- end generated -->\n", "never opened"),
    ("<!-- generated: gate-constants -->\n<!-- generated: gate-constants -->\n"
     "<!-- end generated -->\n", "inside the one at line 1"),
    ("<!-- generated: ratios missing.json ours=triton clock=c -->\n<!-- end generated -->\n",
     "missing.json"),
])
def test_bad_blocks_are_errors_naming_the_doc_and_line(text: str, why: str,
                                                        tmp_path: Path) -> None:
    with pytest.raises(BlockError, match=why) as error:
        render(text, generators(tmp_path), "notes.md")
    assert str(error.value).startswith("notes.md:")


def test_the_doc_generator_reports_a_bad_block_as_a_usage_error(tmp_path: Path,
                                                                   capsys) -> None:
    doc = tmp_path / "notes.md"
    doc.write_text("<!-- generated: nonesuch -->\n<!-- end generated -->\n")
    assert main(["--repo", str(tmp_path), str(doc)]) == 2
    assert "no generator named 'nonesuch'" in capsys.readouterr().err


GATE_TABLE = """- perf gate: medians vs base/line.json -
case    baseline ms  current ms  change  threshold  verdict
------
tests/perf/a.py::test_a[x]    1.000    1.200  +20.0%    6.0%  SLOWER
tests/perf/a.py::test_a[y]    0.300    0.200  -33.3%   40.0%  not gated (too noisy: spread 20.0%)
tests/perf/b.py::test_b[z]   10.000   10.100   +1.0%    6.0%  ok
tests/perf/c.py::test_c[w]  do_bench   3.000    3.300  +10.0%    5.0%  SLOWER
1 ok, 2 SLOWER, 1 not gated (too noisy)
"""


def test_gate_blocks_quote_the_printed_gate_tables(tmp_path: Path) -> None:
    (tmp_path / "run.txt").write_text(GATE_TABLE)
    tallies = generators(tmp_path)["gate-tallies"]("run.txt")
    assert "| `run.txt` | 1 ok, 2 SLOWER, 1 not gated (too noisy) | test_a[x]: 1.000 -> " \
        "1.200 ms (+20.0%, threshold 6.0%, SLOWER); test_c[w]: 3.000 -> 3.300 ms (+10.0%, " \
        "threshold 5.0%, SLOWER) |" in tallies
    assert "compared with `base/line.json` as it was then" in tallies
    cases = generators(tmp_path)["gate-cases"]("run.txt", "test_b")
    assert "| test_b[z] | 10.000 | 10.100 | +1.0% | 6.0% | ok |" in cases
    # every clock the gate names is read, do_bench's too
    assert "| test_c[w] | 3.000 | 3.300 | +10.0% | 5.0% | SLOWER |" in generators(tmp_path)[
        "gate-cases"]("run.txt", "test_c")
    (tmp_path / "other.txt").write_text("not a gate table\n")
    with pytest.raises(ValueError, match="other.txt: not a gate table"):
        generators(tmp_path)["gate-tallies"]("other.txt")


@pytest.mark.parametrize("header", [
    "- perf gate: vs base/line.json (commit abc1234) -",  # a perf session's
    "- perf gate: run.json vs base/line.json (commit abc1234) -",  # `baseline judge`'s
    "- perf gate: medians vs base/line.json -"])  # older perf sessions'
def test_gate_tables_name_their_baseline_in_every_printed_form(tmp_path: Path,
                                                                header: str) -> None:
    (tmp_path / "run.txt").write_text(GATE_TABLE.replace(GATE_TABLE.splitlines()[0], header))
    tallies = generators(tmp_path)["gate-tallies"]("run.txt")
    assert "compared with `base/line.json` as it was then" in tallies


def test_drift_block_is_the_drift_tools_summary(tmp_path: Path) -> None:
    for i, median in enumerate((0.010, 0.011)):
        (tmp_path / f"000{i}_run.json").write_text(json.dumps({
            "machine_info": {"device_name": "GPU"}, "commit_info": {"id": "abc"},
            "benchmarks": [
                {"name": "test_x[sdpa]", "fullname": "t.py::test_x[sdpa]",
                 "stats": {"mean": median, "median": median, "iqr": median / 100,
                           "rounds": 5}},
                {"name": "test_x[ours]", "fullname": "t.py::test_x[ours]",
                 "stats": {"mean": 1.0, "median": 1.0, "iqr": 0.0, "rounds": 5}}]}))
    block = generators(tmp_path)["drift"]("*_run.json", "sdpa")
    assert "| >= 1 ms, spread <= 6% | 1 | 1 | 10.0% | 10.0% | 10.0% | 10.0% |" in block
    assert "The gate's thresholds would flag 1 of the last row's pairs." in block
    assert "From the 2 files `*_run.json`." in block
    with pytest.raises(ValueError, match="no history files match"):
        generators(tmp_path)["drift"]("none/*.json")


def test_markers_in_fenced_code_are_examples_left_alone(tmp_path: Path) -> None:
    text = ("How to write a block:\n\n```markdown\n<!-- generated: nonesuch x.json -->\n"
            "(rewritten)\n<!-- end generated -->\n```\n")
    assert render(text, generators(tmp_path)) == text


def test_breakdowns_stand_side_by_side_per_category(tmp_path: Path) -> None:
    def record(recipe: str, optimizer_ms: float) -> dict:
        return {"recipe": recipe, "machine": "GPU", "measured": "replays", "steps": 3,
                "unprofiled_wall_ms": 10.0 + optimizer_ms,
                "rows": [{"category": "optimizer", "ms": optimizer_ms, "floor_ms": 2.0},
                         {"category": "matmul", "ms": 7.0, "floor_ms": None}]}

    for name, optimizer_ms in (("before", 4.0), ("after", 2.5)):
        (tmp_path / f"{name}.json").write_text(json.dumps(record("optimized", optimizer_ms)))
    block = doc_sources.breakdown_side_by_side(tmp_path, "before.json", "after.json")
    assert "| optimizer | 4.0 | 2.5 | 2.0 |" in block
    assert "| matmul | 7.0 | 7.0 | - |" in block
    assert "| step (unprofiled) | 14.0 | 12.5 | - |" in block
    assert "the files record no commit" in block
    with pytest.raises(ValueError, match="not a breakdown record"):
        doc_sources.breakdown_side_by_side(tmp_path, "missing.json")


def test_headline_gives_one_line_per_topic_with_gpu_time_kind_and_file(tmp_path: Path) -> None:
    history = _write_history(tmp_path)
    out = render(f"<!-- generated: headline {history} triton sdpa_cudnn -->\n"
                 "<!-- end generated -->\n", generators(tmp_path))
    line = out.splitlines()[1]
    assert line.startswith("- **Attention** on GPU fixture, eager end-to-end (host included): ")
    assert "ours (triton) / cuDNN (SDPA) 2.00 (" in line and f"`{history}`, 2026-11-22" in line
    # Eager and CUDA-graph replay against SDPA flash: the kind of most claims (a tie: the
    # first counted) is taken.
    flash = render(f"<!-- generated: headline {history} triton sdpa_flash -->\n"
                   "<!-- end generated -->\n", generators(tmp_path)).splitlines()[1]
    assert "eager end-to-end (host included): ours (triton) / SDPA flash 0.50 (" in flash
    for args in ("hist/none.json triton sdpa_cudnn", f"{history} triton fa4"):  # no file, rival
        with pytest.raises(BlockError):
            render(f"<!-- generated: headline {args} -->\n<!-- end generated -->\n",
                   generators(tmp_path))


