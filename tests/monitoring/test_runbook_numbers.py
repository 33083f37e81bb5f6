"""The EWMA reset runbooks quote measured numbers only through generated blocks, and those blocks equal what the
committed records give (bench/paper/runbook_numbers.py; report.py writes them)."""

from tests.support.helpers import ROOT, paper_module


def test_reset_runbooks_quote_the_records() -> None:
    mod = paper_module("runbook_numbers")
    stale = mod.stale(ROOT / "docs" / "results" / "data")
    assert not stale, f"{stale} drifted from the records: run .venv/bin/python bench/paper/report.py"


def test_the_stale_figures_of_issue_36_are_gone() -> None:
    text = (ROOT / "docs" / "runbooks" / "AsyncRLEwmaReset.md").read_text()
    assert "0.71 in versions" not in text and "versions 5, 8 and 17" not in text
    assert "0.7265 in versions 2–10, 0.7644 in 11–30" in text and "versions 7, 10, 13" in text
