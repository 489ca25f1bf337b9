"""docs/results.md describes the files the program writes: its per-method sections equal the
layout of fresh result files of every method (regenerate them with
MPI_DP_UPDATE_DOCS=1 pytest tests/test_results_doc.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import METHOD_JOBS

from mpi_dp.results import layout

DOC = Path(__file__).resolve().parents[1] / "docs" / "results.md"


@pytest.mark.parametrize("method", tuple(METHOD_JOBS))
def test_the_schema_document_matches_real_files(method_results, method):
    fresh = layout.section(method_results[method])
    doc = DOC.read_text()
    if os.environ.get("MPI_DP_UPDATE_DOCS") == "1":
        DOC.write_text(layout.replace_section(doc, fresh, method))
        doc = DOC.read_text()
    assert layout.current_section(doc, method) == fresh, (
        f"docs/results.md is out of date for {method}: regenerate with MPI_DP_UPDATE_DOCS=1 "
        f"pytest tests/test_results_doc.py\n{fresh}")


def test_every_documented_dataset_has_dimensions_and_a_privacy_mark():
    doc = DOC.read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    table = [r for r in rows if r.count("|") == 6]
    assert len(table) > 50
    for r in table:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert cells[1] and "?" not in cells[1] and "phony" not in cells[1], r
        assert cells[3] in ("yes", "no"), r
