"""Every EWMA reset says whether it worked: the outcome reaches the step line, the Prometheus counter, the
status summary; the step line carries the optimizer's learning rate (issue 36)."""

import dataclasses
import math
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from asyncrl.api.correction import EwmaSpec
from asyncrl.trainer.actor.reports import ewma_reset_fields
from asyncrl.trainer.correction.ewma_reset import ResetStatus
from asyncrl.trainer.driver.loop.accounting import count_ewma_reset
from asyncrl.trainer.driver.run.metrics import create_metrics
from asyncrl.trainer.driver.run.step_report import step_line
from asyncrl.trainer.driver.status.reporter import StatusReporter
from asyncrl.trainer.oldlogits.ewma import EwmaProvider

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.step_reports import step_report  # noqa: E402


def _with(report, **metrics):  # type: ignore[no-untyped-def]
    m = dataclasses.replace(report.actor.metrics, **metrics)
    return report.with_(actor=dataclasses.replace(report.actor, metrics=m))


def test_step_line_carries_threshold_outcome_and_learning_rate() -> None:
    plain = step_line(step_report(3))
    assert "ewma_reset_threshold" not in plain and "ewma_reset_outcome" not in plain  # nan / "": left out
    line = step_line(_with(step_report(3), ewma_reset_threshold=0.61234567, ewma_reset_outcome="unrecovered",
                           learning_rate=3e-4))
    assert line["ewma_reset_threshold"] == 0.612346 and line["ewma_reset_outcome"] == "unrecovered"
    assert line["learning_rate"] == 3e-4


def test_outcomes_counted_by_label() -> None:
    registry = CollectorRegistry()
    m = create_metrics(registry)
    v = registry.get_sample_value
    assert v("asyncrl_ewma_reset_outcomes_total", {"outcome": "unrecovered"}) == 0.0  # preset
    count_ewma_reset(m, "keep_ratio_collapse")
    count_ewma_reset(m, "", "unrecovered")
    count_ewma_reset(m, "keep_ratio_collapse", "recovered")
    assert v("asyncrl_ewma_resets_total", {"reason": "keep_ratio_collapse"}) == 2.0
    assert v("asyncrl_ewma_reset_outcomes_total", {"outcome": "unrecovered"}) == 1.0
    assert v("asyncrl_ewma_reset_outcomes_total", {"outcome": "recovered"}) == 1.0


def test_status_carries_the_outcome_totals_for_the_ewma_reference_only() -> None:
    sent: list[dict] = []
    rep = StatusReporter(sent.append, clock=lambda: 0.0)
    rep.observe(step_report(1))  # reference "behavior": no outcome fields
    assert "ewmaResetsRecovered" not in rep.summary().to_status_dict()
    rep.observe(_with(step_report(2), reference="ewma", ewma_resets_recovered_total=3, ewma_resets_unrecovered_total=1))
    training = rep.summary().to_status_dict()
    assert training["ewmaResetsRecovered"] == 3 and training["ewmaResetsUnrecovered"] == 1


def test_report_fields_from_the_ewma_provider_only() -> None:
    assert ewma_reset_fields(object()) == {}
    provider = EwmaProvider(EwmaSpec(), max_staleness=3)
    fields = ewma_reset_fields(provider)  # before its first version: no threshold, no outcome
    assert math.isnan(fields.pop("ewma_reset_threshold"))  # type: ignore[arg-type]
    assert fields == {"ewma_reset_outcome": "", "ewma_resets_recovered_total": 0, "ewma_resets_unrecovered_total": 0}
    assert math.isnan(ResetStatus().threshold)
