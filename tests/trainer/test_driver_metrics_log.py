"""``metrics.jsonl`` read back typed: a step line and an evaluation line as the loop writes them, the
correction counts through ``CorrectionStats.from_record``, and the resume's cut of the log."""

import json
import math
from pathlib import Path

import pytest

from asyncrl.trainer.driver.loop.evaluation import EvalResult
from asyncrl.trainer.driver.run.metrics_log import EvalLine, StepLine, parse_line, read_metrics
from asyncrl.trainer.driver.run.rundir import RunDir
from asyncrl.trainer.driver.run.step_report import step_line
from tests.support.step_reports import step_report


def test_a_step_line_reads_back_as_the_report_that_wrote_it(tmp_path: Path) -> None:
    report = step_report(3, valid=200, keep=0.75, staleness=2, ewma_reset=True)
    run = RunDir.create(tmp_path)
    run.append_step(step_line(report))
    (line,) = read_metrics(run.metrics_jsonl)
    assert isinstance(line, StepLine)
    assert (line.step, line.applied, line.version, line.staleness_max, line.ewma_reset) == (3, True, 3, 2, 1)
    assert (line.reward_mean, line.success_rate, line.wall_s) == (0.5, 0.5, 1.0)
    assert line.correction == report.actor.metrics.correction  # every count, through from_record
    assert line.correction is not None and line.correction.keep_ratio == 0.75  # 150 kept of 200
    assert line.record == json.loads(run.metrics_jsonl.read_text())  # as written ("nan" for NaN), for a resume


def test_a_step_not_applied_has_no_version_and_a_nan_loss_is_a_nan() -> None:
    line = parse_line({**step_line(step_report(4, applied=False)), "reward_mean": "nan"})  # JSON has no NaN: "nan"
    assert isinstance(line, StepLine) and not line.applied and line.version is None
    assert line.reward_mean is not None and math.isnan(line.reward_mean)


def test_an_evaluation_line_is_its_own_kind() -> None:
    # 3 of 4 solved: success 0.75; 1.5 s long, 12 s into the run
    line = parse_line(EvalResult(4, 4, 3, 3.0, 40, 1.5, 0.25).record(12.0))
    assert isinstance(line, EvalLine)
    assert (line.step, line.version, line.success, line.reward, line.wall_s, line.seconds) == (4, 4, 0.75, 0.75, 12.0, 1.5)
    with pytest.raises(ValueError, match="an evaluation line without a number 'eval_success'"):
        parse_line({"step": 2, "eval_version": 2, "wall_s": 1.0, "eval_reward": 0.0})


def test_a_line_without_counts_has_no_correction_and_half_a_record_is_refused() -> None:
    line = parse_line({"step": 1})  # a hand-made line, or a log from before the counts were logged
    assert isinstance(line, StepLine) and line.correction is None and not line.applied and line.reward_mean is None
    with pytest.raises(KeyError, match="not a correction record: missing"):
        parse_line({"step": 1, "valid_tokens": 10.0})


def test_the_resume_keeps_the_lines_up_to_its_version_verbatim(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path)
    for v in (1, 2, 3):
        run.append_step(step_line(step_report(v)))
    run.append_step(EvalResult(2, 4, 1, 1.0, 9, 0.5, 0.0).record(5.0))
    before = run.metrics_jsonl.read_text().splitlines(keepends=True)
    kept = run.keep_steps_up_to(2)
    # steps 1, 2 and the evaluation of version 2 stay (step 3 is redone), their text unchanged
    assert [r["step"] for r in kept] == [1, 2, 2]
    assert run.metrics_jsonl.read_text() == "".join([before[0], before[1], before[3]])
