"""The typed run summary: filled as the run goes (``SummaryDraft``), made once (``RunSummary``), and
serialised to exactly the ``summary.json`` the dict-built summary wrote (same keys, values and order)."""

import json
from dataclasses import fields
from pathlib import Path

import pytest

from asyncrl.trainer.driver.loop.accounting import summarise
from asyncrl.trainer.driver.loop.evaluation import EvalResult
from asyncrl.trainer.driver.run.rundir import RunDir
from asyncrl.trainer.driver.run.summary import RunSummary, StepTotals, SummaryDraft

STEPS = [{"step": v, "version": v, "applied": True, "success_rate": 0.25 * v, "reward_mean": 0.5 * v, "wall_s": 2.0 * v}
         for v in (1, 2)]
EVALS = [EvalResult(0, 4, 1, 1.0, 9, 0.5, 0.0).record(1.0), EvalResult(2, 4, 3, 3.0, 9, 0.25, 0.0).record(5.0)]
RECORDS = [EVALS[0], *STEPS, EVALS[1]]


def _old_summary_of_a_resumed_preempted_run() -> dict[str, object]:
    """The summary as run_job built it before it was typed: a dict filled in this order (every part present)."""
    s: dict[str, object] = {"job": "j", "run_dir": "runs/j", "status": "running", "max_staleness": 2,
                            "reference": "ewma", "metrics_url": None, "restarts": 1}
    s["restart_causes"] = ["actor rank 1 died"]
    s["metrics_url"] = "http://127.0.0.1:9400/metrics"
    s["startup_s"] = 3.21
    s["model_load"] = {"folder": "m", "seconds": 1.5}
    s.setdefault("notices", []).extend(["checkpoint step-000004 skipped"])  # type: ignore[attr-defined]
    s["resumed_from"] = "runs/j/checkpoints/step-000002"
    s["start_version"] = 2
    s["startup_check"] = {"passed": True, "engines": []}
    s.setdefault("notices", [])
    s["resume"] = {"cursors": [4, 4], "groups_aborted_at_resume": 1}
    s["export"] = {"path": "runs/j/exports/step-000002", "version": 2}
    s["final_checkpoint"] = "runs/j/checkpoints/step-000003"
    s["stopped"] = {"signal": "SIGTERM", "version": 3, "checkpoint_s": 0.5, "seconds_after_signal": 0.75}
    s.update({"dedicated": {"replacements": 0}})  # the stage's summary
    s["worker_replacements"] = 0
    s["env_errors"] = {"exception": 0, "timeout": 0}
    s["buffer"] = {"groups_admitted": 4, "groups_in_flight_at_end": 0}
    s["loop"] = {"wall_s": 9.5, "eval_s": 0.75}
    s["status"] = "preempted"
    s.update(summarise(RECORDS, 12.345).to_json())
    s["report"] = "runs/j/report.png"
    return s


def _draft_of_the_same_run() -> SummaryDraft:
    d = SummaryDraft(job="j", run_dir="runs/j", max_staleness=2, reference="ewma", restarts=1)
    d.restart_causes = ("actor rank 1 died",)
    d.metrics_url = "http://127.0.0.1:9400/metrics"
    d.startup_s = 3.21
    d.model_load = {"folder": "m", "seconds": 1.5}
    d.notes().extend(["checkpoint step-000004 skipped"])
    d.resumed_from = "runs/j/checkpoints/step-000002"
    d.start_version = 2
    d.startup_check = {"passed": True, "engines": []}
    d.resume = {"cursors": [4, 4], "groups_aborted_at_resume": 1}
    d.export = {"path": "runs/j/exports/step-000002", "version": 2}
    d.final_checkpoint = "runs/j/checkpoints/step-000003"
    d.stopped = {"signal": "SIGTERM", "version": 3, "checkpoint_s": 0.5, "seconds_after_signal": 0.75}
    d.add_stage({"dedicated": {"replacements": 0}})
    d.worker_replacements = 0
    d.env_errors = {"exception": 0, "timeout": 0}
    d.buffer = {"groups_admitted": 4, "groups_in_flight_at_end": 0}
    d.loop = {"wall_s": 9.5, "eval_s": 0.75}
    return d


def test_summary_json_is_byte_for_byte_what_the_dict_wrote(tmp_path: Path) -> None:
    summary = _draft_of_the_same_run().finish("preempted", totals=summarise(RECORDS, 12.345),
                                              report="runs/j/report.png")
    run = RunDir.create(tmp_path)
    old = json.dumps(_old_summary_of_a_resumed_preempted_run(), indent=2) + "\n"
    assert run.write_summary(summary.to_json()).read_text() == old


def test_a_run_that_failed_at_once_writes_only_what_it_reached() -> None:
    # the dict of a run whose metrics endpoint failed to bind: the start, the error, the (empty) totals, the report
    old: dict[str, object] = {"job": "j", "run_dir": "r", "status": "running", "max_staleness": 0,
                              "reference": "current", "metrics_url": None, "restarts": 0}
    old["status"] = "failed"
    old["error"] = "OSError: [Errno 98] Address already in use"
    old.update(summarise([], 0.5).to_json())
    old["report"] = "r/report.png"
    draft = SummaryDraft(job="j", run_dir="r", max_staleness=0, reference="current")
    summary = draft.finish("failed", error="OSError: [Errno 98] Address already in use",
                           totals=summarise([], 0.5), report="r/report.png")
    assert json.dumps(summary.to_json(), indent=2) == json.dumps(old, indent=2)
    assert summary.to_json()["eval_s"] == 0 and summary.to_json()["eval_curve"] == []  # int 0, as sum([]) wrote


def test_the_draft_holds_the_summary_fields_in_the_summary_order() -> None:
    ended = {"status", "error", "totals", "report"}  # what only the run's end knows
    assert [f.name for f in fields(SummaryDraft)] == [f.name for f in fields(RunSummary) if f.name not in ended]


def test_a_summary_read_back_is_the_summary_written() -> None:
    summary = _draft_of_the_same_run().finish("preempted", totals=summarise(RECORDS, 12.345), report="x.png")
    back = RunSummary.from_json(json.loads(json.dumps(summary.to_json())))
    assert back == summary
    assert back.totals is not None and back.totals.eval_curve[1].version == 2 and back.notices == (
        "checkpoint step-000004 skipped",)
    partial = RunSummary.from_json({"job": "j", "status": "failed", "error": "boom", "unknown": 1})
    assert (partial.totals, partial.max_staleness, partial.error) == (None, None, "boom")


def test_totals_are_the_log_added_up() -> None:
    t = summarise(RECORDS, 12.345)
    # success 0.25, 0.5 -> mean 0.375; reward 0.5, 1.0 -> 0.75; evals 1/4 then 3/4, 0.5 + 0.25 s of evaluating
    assert (t.steps_done, t.start_success, t.final_reward, t.final_version) == (2, 0.375, 0.75, 2)
    assert (t.eval_first, t.eval_last, t.eval_s) == (0.25, 0.75, 0.75)
    # eval 2 at wall 5.0, eval 0 at 1.0, 0.25 s of it evaluating: 5.0 - 1.0 - 0.25 = 3.75 s of training
    assert [p.loop_s for p in t.eval_curve] == [0.0, 3.75]
    assert StepTotals.from_json(t.to_json()) == t


def test_a_stage_summary_is_one_of_the_named_parts() -> None:
    d = SummaryDraft(job="j", run_dir="r", max_staleness=1, reference="exact")
    d.add_stage({})
    assert (d.dedicated, d.interrupt_sync) == (None, None)
    d.add_stage({"interrupt_sync": {"syncs": 3}})
    assert d.interrupt_sync == {"syncs": 3}
    with pytest.raises(ValueError, match="unknown stage summary 'snapshot'; valid: interrupt_sync, dedicated"):
        d.add_stage({"snapshot": {}})


def test_on_start_hears_the_summary_so_far_as_json() -> None:
    d = SummaryDraft(job="j", run_dir="r", max_staleness=1, reference="ewma")
    assert d.to_json() == {"job": "j", "run_dir": "r", "status": "running", "max_staleness": 1,
                           "reference": "ewma", "metrics_url": None, "restarts": 0}
