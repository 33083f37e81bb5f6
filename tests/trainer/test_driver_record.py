"""``_Loop._record``: the one place an event becomes a ``metrics.jsonl`` line, and the typed event that
``on_step`` (the status reporter, Prometheus) receives carries the same running totals as that line."""

import time
from types import SimpleNamespace
from typing import Any

from asyncrl.trainer.driver.loop.staleness import StalenessBuffer
from asyncrl.trainer.driver.loop.training_loop import _Loop
from asyncrl.trainer.driver.run.step_report import StepReport
from tests.support.step_reports import step_report


def test_the_typed_step_report_carries_the_stale_dropped_groups_of_its_line() -> None:
    lines: list[dict[str, Any]] = []
    typed: list[Any] = []
    loop = object.__new__(_Loop)  # only what _record touches: the buffer, the run directory, the callback
    loop.started = time.monotonic()
    loop.buffer = StalenessBuffer(max_staleness=1, groups_per_step=2)
    loop.buffer.counts.groups_dropped_stale = 3  # three groups went past the staleness bound so far
    loop.reports, loop.records = [], []
    loop.run_dir = SimpleNamespace(append_step=lines.append)
    loop.on_step = typed.append
    loop._gauges = lambda: None  # type: ignore[method-assign]

    line = loop._record(step_report(4))

    assert line["dropped_groups_total"] == 3 and lines == [line]
    (event,) = typed
    assert isinstance(event, StepReport) and event.dropped_groups_total == 3  # was 0: only the line had it
    assert loop.reports == [event]
