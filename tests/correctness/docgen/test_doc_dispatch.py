"""The dispatch blocks: the table as `dispatch.TABLE` holds it, and a study run's shapes with
the pair that beat the default by the table's margin, or the default where none did."""

from __future__ import annotations

import json
from pathlib import Path

from systems.attention import dispatch
from tools.docgen.doc_blocks import render
from tools.docgen.doc_sources import generators


def test_the_table_block_has_a_row_per_rule_in_order():
    text = render("<!-- generated: attention-dispatch-table -->\n<!-- end generated -->\n",
                  generators(Path(".")))
    rows = [line for line in text.splitlines() if line.startswith("| sm_")]
    assert len(rows) == len(dispatch.TABLE)
    for row, rule in zip(rows, dispatch.TABLE, strict=True):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[2:5] == [str(rule.head_dim), str(rule.min_seq), str(rule.min_tokens)]


def _row(seq: int, ms: dict[str, float], over: dict[str, float]) -> dict:
    return {"seq": seq, "head_dim": 80, "tokens": 262144, "matrices": 128, "wrong": {},
            "ms": ms, "over_default": over}


def test_the_study_block_names_a_pair_only_where_it_beat_the_default_by_the_margin(tmp_path):
    default, gluon = dispatch.DEFAULT.name, "triton+gluon_ordered"
    ms = {"sdpa_cudnn": 2.0, "sdpa_flash": 3.0, default: 2.2, gluon: 1.9}
    rows = [_row(4096, ms, {"sdpa_cudnn": 0.9, "sdpa_flash": 1.4, default: 1.0, gluon: 0.85}),
            # a pair ahead by less than the margin, and a rival ahead: the default stays
            _row(512, ms, {"sdpa_cudnn": 0.5, "sdpa_flash": 1.4, default: 1.0,
                           gluon: (1 + dispatch.WIN) / 2})]
    (tmp_path / "run.json").write_text(json.dumps({"device": "GPU", "torch": "2", "rows": rows}))
    text = render("<!-- generated: attention-dispatch-study run.json -->\n"
                  "<!-- end generated -->\n", generators(tmp_path))
    lines = {line.split("|")[2].strip(): line for line in text.splitlines()
             if line.startswith("| 80 |")}
    assert "Triton + Gluon, dQ in a fixed order | 1.900 | 0.85 | 0.95" in lines["4096"]
    assert "Triton + two passes | 2.200 | 1.00 | 1.10" in lines["512"]


def test_the_study_block_keeps_only_the_shapes_of_the_tokens_asked_for(tmp_path):
    default = dispatch.DEFAULT.name
    ms = {"sdpa_cudnn": 2.0, "sdpa_flash": 3.0, default: 2.2}
    over = {"sdpa_cudnn": 0.9, "sdpa_flash": 1.4, default: 1.0}
    rows = [_row(4096, ms, over), {**_row(2048, ms, over), "tokens": 32768}]
    (tmp_path / "run.json").write_text(json.dumps({"device": "GPU", "torch": "2", "rows": rows}))
    text = render("<!-- generated: attention-dispatch-study run.json 262144 -->\n"
                  "<!-- end generated -->\n", generators(tmp_path))
    shapes = [line.split("|")[2].strip() for line in text.splitlines()
              if line.startswith("| 80 |")]
    assert shapes == ["4096"]
