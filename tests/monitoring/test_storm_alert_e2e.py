"""End to end: AsyncRLEwmaResetStorm (unrecovered resets) fires for a lagging EWMA reference and stays silent
for a healthy run at learning rate 3e-4, on a real Prometheus with the chart's rules as helm renders them.

``bench/paper/storm_evidence.py`` runs the two real ``asyncrl run`` jobs (see its docstring); the committed
record ``docs/results/data/alerts/storm_evidence.json`` is its output.
"""

import shutil
from pathlib import Path

import pytest

from tests.support.helpers import paper_module

pytestmark = pytest.mark.slow


def test_storm_alert_fires_for_the_lagging_reference_only(tmp_path: Path, paper_warm_start: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found; run `make tools` (Debian package prometheus)", pytrace=False)
    mod = paper_module("storm_evidence")
    ev = mod.collect(tmp_path / "storm", seed=0, warm_start=paper_warm_start, log=lambda _m: None)
    unrecovered = {n: sum(o["outcome"] == "unrecovered" for o in j["own_outcomes"]) for n, j in ev["jobs"].items()}
    assert unrecovered["lagging"] >= 2, f"the lagging job had {unrecovered['lagging']} unrecovered resets: nothing to show"
    assert unrecovered["healthy"] < 2, unrecovered
    fired = {f["labels"]["asyncrljob"]: f for f in ev["firing"] if f["alert"] == mod.ALERT}
    assert set(fired) == {"lagging"}, (fired, unrecovered)
    f = fired["lagging"]
    assert f["labels"]["severity"] == "warning" and f["labels"]["namespace"] == "paper"
    second = [o["version"] for o in ev["jobs"]["lagging"]["own_outcomes"] if o["outcome"] == "unrecovered"][1]
    assert second <= f["seen_at_version"] <= ev["steps"], (f, second)  # while it ran, after its 2nd unrecovered reset
    assert all(j["exit_code"] == 0 for j in ev["jobs"].values())
