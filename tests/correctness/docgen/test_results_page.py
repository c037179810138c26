"""The results page (docs/RESULTS.md), its tables and plots, from real smoke runs and test
fixtures."""

from __future__ import annotations

import pytest
from smoke_runs import save_smoke_runs

from systems.runs import keys
from systems.runs.history import Result, latest_results, load_runs
from tools.docgen.results_page import ddp_table, recipes_table, write_results_page
from tools.docgen.results_plots import allreduce_bandwidth, ddp_variants

PNG = b"\x89PNG\r\n\x1a\n"


def test_results_command_writes_page_and_plots(smoke_runs, tmp_path) -> None:
    out = tmp_path / "docs" / "RESULTS.md"
    assert "wrote" in write_results_page(smoke_runs, out, include_cpu=True)
    page = out.read_text()
    assert "Model step time by size" in page
    assert "systems report latest --gpu" in page  # every case's newest result is there
    assert "### Attention" not in page  # no attention results, no section
    images = [line.split("(")[1].rstrip(")") for line in page.splitlines()
              if line.startswith("![")]
    assert images and all((out.parent / i).read_bytes()[:8] == PNG for i in images)
    # CPU runs are left out unless asked for: with nothing else, there is nothing to report.
    with pytest.raises(ValueError, match="CPU runs are left out"):
        write_results_page(smoke_runs, out)


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


def test_results_page_skips_a_malformed_history_with_one_warning(
        storage_with_a_bad_run, tmp_path, capsys) -> None:
    storage, bad = storage_with_a_bad_run
    out = tmp_path / "docs" / "RESULTS.md"
    write_results_page(storage, out, include_cpu=True)
    err = capsys.readouterr().err
    assert err.count(str(bad)) == 1 and "skipping" in err
    page = out.read_text()
    runs = sum(1 for p in storage.rglob("*.json") if p != bad)
    assert f"{runs} saved runs" in page and bad.name not in page
