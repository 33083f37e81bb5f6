"""The route-flip share of routing replay: in the step line and the Prometheus counters (only with replay)."""

import dataclasses

from prometheus_client import CollectorRegistry

from asyncrl.trainer.driver.loop.accounting import count_old_logits
from asyncrl.trainer.driver.run.metrics import create_metrics
from asyncrl.trainer.driver.run.step_report import step_line
from tests.support.step_reports import step_report


def _with_flips(flips: float, tokens: float):  # noqa: ANN202
    report = step_report(3, valid=200, keep=0.75, staleness=1)
    metrics = dataclasses.replace(report.actor.metrics, route_flips=flips, route_tokens=tokens)
    return report.with_(actor=dataclasses.replace(report.actor, metrics=metrics))


def test_step_line_has_the_share_only_with_replay() -> None:
    assert "route_flip_frac" not in step_line(_with_flips(0.0, 0.0))
    line = step_line(_with_flips(30.0, 200.0))
    assert line["route_flip_frac"] == 0.15 and line["route_replayed_tokens"] == 200.0  # 30 / 200


def test_counters_are_numerator_and_denominator() -> None:
    registry = CollectorRegistry()
    m = create_metrics(registry)
    for flips in (30.0, 10.0):
        count_old_logits(m, _with_flips(flips, 200.0).actor.metrics, "current")
    assert registry.get_sample_value("asyncrl_route_flip_tokens_total") == 40.0
    assert registry.get_sample_value("asyncrl_route_replayed_tokens_total") == 400.0
