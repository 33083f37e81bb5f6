"""docs/correction-metrics.md is generated from the metric table and must not drift."""

import dataclasses
from pathlib import Path

from asyncrl.trainer.correction.docs import render
from asyncrl.trainer.correction.stats import METRICS, CorrectionStats

ROOT = Path(__file__).resolve().parents[2]


def test_doc_matches_table() -> None:
    doc = (ROOT / "docs" / "correction-metrics.md").read_text()
    assert doc == render(), "regenerate: python -m asyncrl.trainer.correction.docs docs/correction-metrics.md"


def test_every_stat_is_documented() -> None:
    documented = [m.name for m in METRICS]
    assert documented == [f.name for f in dataclasses.fields(CorrectionStats)]
