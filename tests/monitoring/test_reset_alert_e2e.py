"""End to end: the shipped EWMA reset alert fires for the run whose reference resets, during the run, and
never for the healthy one.

``bench/paper/alert_evidence.py`` runs two real ``asyncrl run`` jobs of ``docs/results.md`` section 2 (decay 0.9
with the paper's reset rule in its stress block, learning rate 1e-3, and the staleness-aware decay at a scale
where the policy moves slowly), each serving its own ``/metrics``, under a real Prometheus (the Debian package) that
evaluates the chart's rules exactly as helm renders them with the shipped values (nothing shortened:
AsyncRLEwmaReset is ``for: 0m`` over a 5m ``increase``). What must hold: the alert fires for a job if and only
if that job's own ``metrics.jsonl`` recorded a reset, with the labels the runbook reads (namespace, job, reason
``keep_ratio_collapse``, severity ``info``), while the job was running (first seen at a version the job had
reached, no earlier than its first reset), and the reset job did reset (else the test proves nothing). The
committed evidence record (``docs/results/data/alerts/evidence.json``) is this function's output.
"""

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.helpers import ROOT, paper_module

pytestmark = pytest.mark.slow
PAPER = ROOT / "bench" / "paper"


def _evidence() -> ModuleType:
    return paper_module("alert_evidence")


def test_reset_alert_fires_for_the_resetting_run_only(tmp_path: Path, paper_warm_start: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found; run `make tools` (Debian package prometheus)", pytrace=False)
    ev_mod = _evidence()
    ev = ev_mod.collect(tmp_path / "alerts", seed=0, warm_start=paper_warm_start, log=lambda _m: None)
    print(json.dumps(ev["firing"], indent=1))
    own = {name: j["own_resets"] for name, j in ev["jobs"].items()}
    assert own["resets"], "the decay-0.9 job never reset at seed 0: nothing for the alert to show"
    fired = {f["labels"]["asyncrljob"]: f for f in ev["firing"] if f["alert"] == ev_mod.ALERT}
    assert set(fired) == {name for name, resets in own.items() if resets}, (fired, own)
    assert "healthy" not in fired and not own["healthy"]
    f = fired["resets"]
    assert f["labels"]["namespace"] == ev_mod.NAMESPACE and f["labels"]["reason"] == "keep_ratio_collapse"
    assert f["labels"]["severity"] == "info"
    # during the run: seen firing at a version the job had reached, at or after its first reset
    assert own["resets"][0]["version"] <= f["seen_at_version"] <= ev["steps"], (f, own["resets"])
    assert all(j["exit_code"] == 0 for j in ev["jobs"].values())
