"""The dispatch block: the table as `dispatch.TABLE` holds it."""

from __future__ import annotations

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


