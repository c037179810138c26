"""The one-matrix study block: a row per shape, a column per backward, each cell the median
(range) of that backward's per-round ratios to SDPA cuDNN's, "–" where a run lacks it."""

from __future__ import annotations

import json
from pathlib import Path

from tools.docgen.doc_blocks import render
from tools.docgen.doc_sources import generators


def _row(shape: list[int], ms: dict[str, list[float]], wrong: list[str]) -> dict:
    return {"shape": shape, "wrong": wrong, "ms_per_round": ms}


def _block(tmp_path: Path, rows: list[dict]) -> list[str]:
    run = {"rounds": 3, "device": "GPU", "commit": "abc", "rows": rows}
    (tmp_path / "run.json").write_text(json.dumps(run))
    text = render("<!-- generated: attention-one-matrix run.json -->\n<!-- end generated -->\n",
                  generators(tmp_path))
    return text.splitlines()


def test_each_shape_is_one_row_of_ratios_to_cudnn(tmp_path):
    cudnn = [2.0, 4.0, 2.0]
    lines = _block(tmp_path, [
        _row([1, 4096, 64], {"library": [1.0, 4.0, 3.0], "SDPA cuDNN": cudnn}, []),
        _row([2, 4096, 64], {"library": [2.0, 2.0, 2.0], "alternating": [3.0, 3.0, 3.0],
                             "SDPA cuDNN": cudnn}, [])])
    assert lines[1] == "| matrices x seq x d | SDPA cuDNN ms | library | alternating |"
    assert lines[3] == "| 1x4096x64 | 2.000 | 1.00 (0.50–1.50) | – |"
    assert lines[4] == "| 2x4096x64 | 2.000 | 1.00 (0.50–1.00) | 1.50 (0.75–1.50) |"
    assert "repeated bit for bit" in "\n".join(lines)


def test_a_variant_that_differed_is_named(tmp_path):
    lines = _block(tmp_path, [_row([1, 4096, 64], {"library": [1.0], "SDPA cuDNN": [1.0]},
                                   ["library"])])
    assert "DIFFERED for library" in "\n".join(lines)
