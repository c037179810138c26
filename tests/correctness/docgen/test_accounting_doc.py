"""docs/accounting.md's tables: a row per case."""

from __future__ import annotations

from systems.model import MODEL_CONFIGS
from tools.docgen import doc_accounting as doc


def test_every_table_renders_a_row_per_case() -> None:
    assert len(doc.config_memory_table().splitlines()) == 2 + len(MODEL_CONFIGS) - 1  # no tiny
    assert "| 2.7b | 32 |" in doc.checkpointing_table()
    assert "none fits" in doc.xxl_table()
    assert len(doc.communication_table().splitlines()) == 2 + 2 * 3
