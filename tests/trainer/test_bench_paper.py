"""bench/paper/: the harness's arithmetic on hand-made curves and Proposition 1's exact per-token check on
one batch (fast), and every experiment in its ``--quick`` form (slow): each writes its markdown table and
its PNG figure. No timing or learning outcome is asserted: the quick scale is a smoke test."""

import importlib.util
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.helpers import ROOT

PAPER = ROOT / "bench" / "paper"
EXPERIMENTS = ("methods", "system_cost", "thresholds", "ewma", "prop1")


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(PAPER))  # the scripts import their sibling harness
    try:
        spec = importlib.util.spec_from_file_location(f"bench_paper_{name}", PAPER / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(PAPER))


harness = _load("harness")


def test_curve_metrics_by_hand() -> None:
    curve = [{"version": 0, "success": 0.2, "loop_s": 0.0}, {"version": 10, "success": 0.4, "loop_s": 5.0},
             {"version": 20, "success": 0.8, "loop_s": 11.0}]
    m = harness.curve_metrics({"eval_curve": curve, "loop_s": 12.0}, level=0.4)
    # trapezoid: (10 * 0.3 + 10 * 0.6) / 20 = 0.45
    assert m == {"final": 0.8, "auc": pytest.approx(0.45), "versions_to_level": 10.0, "seconds_to_level": 5.0,
                 "loop_s": 12.0}
    never = harness.curve_metrics({"eval_curve": curve, "loop_s": 12.0}, level=0.9)
    assert math.isnan(never["versions_to_level"]) and math.isnan(never["seconds_to_level"])


def test_fmt_counts_seeds_that_have_a_value() -> None:
    assert harness.fmt([0.5, 0.7]) == "0.600 ± 0.141"
    assert harness.fmt([4.0, float("nan")], 1) == "4.0 ± 0.0 (1/2)"
    assert harness.fmt([float("nan")]) == "never"


def test_shared_runs_have_one_cache_key() -> None:
    # The methods table's exact, ewma and loglinear runs are the other experiments' shared cells.
    thresholds, ewma = _load("thresholds"), _load("ewma")
    assert harness.method("exact").key() in {c.key() for c in thresholds.grid()}
    assert harness.method("ewma").key() in {c.key() for c in ewma.grid()}
    assert len({c.key() for c in harness.METHODS}) == len(harness.METHODS)
    with pytest.raises(KeyError, match="valid: sync, behavior"):
        harness.method("ppo")


def test_prop1_keep_decisions_identical_on_one_batch() -> None:
    prop1 = _load("prop1")
    bad, n = prop1.keep_disagreements([0, 1, 2, 3], B=32, T=16)
    assert n == 512 and bad == 0


@pytest.mark.slow
def test_quick_mode_writes_every_table_and_figure(tmp_path: Path) -> None:
    for name in EXPERIMENTS:  # one cache: later experiments reuse the methods runs, as in the full suite
        proc = subprocess.run([sys.executable, str(PAPER / f"{name}.py"), "--quick", "--out", str(tmp_path)],
                              cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (name, proc.stdout[-2000:], proc.stderr[-4000:])
        table, png = tmp_path / "quick" / f"{name}.md", tmp_path / "quick" / f"{name}.png"
        assert table.exists() and "| " in table.read_text() and "command:" in table.read_text(), name
        assert png.exists() and 0 < png.stat().st_size < 200_000, name
