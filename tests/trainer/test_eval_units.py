"""The evaluation's pure parts: when it is due, how prompts are shared, the version check, its record,
metrics, summary keys, console line and report panel."""

import re

import pytest
from prometheus_client import CollectorRegistry

from asyncrl.api.evaluation import EVAL_UNUSED_MESSAGE, EvalMode, EvalSpec
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.envs.split import is_heldout
from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.cli.console import format_summary
from asyncrl.trainer.driver.loop.accounting import (
    count_eval,
    eval_loop_seconds,
    set_job_gauges,
    summarise,
)
from asyncrl.trainer.driver.loop.evaluation import (
    GREEDY_TEMPERATURE,
    EvalResult,
    Evaluator,
    check_versions,
    eval_temperature,
    shares,
)
from asyncrl.trainer.driver.run.metrics import create_metrics
from asyncrl.trainer.driver.run.metrics_log import parse_lines
from asyncrl.trainer.driver.run.rundir import write_report
from asyncrl.trainer.driver.run.summary import RunSummary
from bench.async_speedup import success_at_loop_seconds


def _spec(**eval_: object) -> AsyncRLJobSpec:
    return AsyncRLJobSpec.model_validate({"task": {"name": "calculator", "temperature": 0.7}, "eval": eval_})


def test_spec_defaults_off_and_settings_need_every_steps() -> None:
    assert not EvalSpec().enabled and EvalSpec().mode is EvalMode.GREEDY
    assert _spec(everySteps=5, prompts=8, mode="temperature", seed=3).eval.prompts == 8
    with pytest.raises(ValueError, match=re.escape(f"{EVAL_UNUSED_MESSAGE} (set here: prompts)")):
        _spec(prompts=8)
    for bad in ({"everySteps": -1}, {"everySteps": 1, "prompts": 0}, {"everySteps": 1, "mode": "beam"}):
        with pytest.raises(ValueError, match="eval"):
            _spec(**bad)


def test_due_at_multiples_at_the_start_and_at_the_end_once() -> None:
    ev = Evaluator(_spec(everySteps=4, prompts=3))
    due = [v for v in range(0, 11) if ev.due(v, last_version=10, evaluated=set())]
    assert due == [0, 4, 8, 10]
    assert not ev.due(4, 10, evaluated={4})  # a resumed run does not evaluate a logged version again
    assert not Evaluator(_spec()).due(0, 10, set())  # everySteps 0: never


def test_problems_are_held_out_fixed_and_the_temperature_follows_the_mode() -> None:
    a, b = Evaluator(_spec(everySteps=1, prompts=16)), Evaluator(_spec(everySteps=1, prompts=16))
    assert a.problems == b.problems and len(a.problems) == 16
    assert all(is_heldout(p["question"]) for p in a.problems)
    assert Evaluator(_spec(everySteps=1, prompts=16, seed=1)).problems != a.problems
    assert eval_temperature(_spec(everySteps=1)) == GREEDY_TEMPERATURE
    assert eval_temperature(_spec(everySteps=1, mode="temperature")) == 0.7  # task.temperature


def test_shares_are_contiguous_and_cover_every_prompt_once() -> None:
    assert shares(7, 3) == [(0, 3), (3, 5), (5, 7)]  # 7 = 3 + 2 + 2
    assert shares(1, 3) == [(0, 1), (1, 1), (1, 1)]  # workers without a share get an empty range
    assert sum(stop - start for start, stop in shares(64, 5)) == 64


def _traj(versions: list[int], tid: str = "eval-v3-p0") -> Trajectory:
    n = len(versions)
    return Trajectory(traj_id=tid, group_id=tid, task="calculator", tokens=[1] * (n + 1), prompt_len=1,
                      loss_mask=[False] + [True] * n, versions=[-1, *versions], logp_mu=[0.0] * (n + 1),
                      turn_ids=[-1] + [0] * n)


def test_an_evaluation_must_see_exactly_one_version() -> None:
    check_versions([_traj([3, 3]), _traj([3])], 3)
    with pytest.raises(RuntimeError, match=r"1 trajectories hold tokens of other versions.*'eval-v3-p1', \[2, 3\]"):
        check_versions([_traj([3]), _traj([2, 3], "eval-v3-p1")], 3)


def test_record_metrics_and_summary() -> None:
    # 3 of 4 solved, rewards 1+1+1+0 = 3 -> success 0.75, reward 0.75
    r = EvalResult(version=4, prompts=4, succeeded=3, reward_sum=3.0, sampled_tokens=40, seconds=1.5,
                   drain_seconds=0.25)
    rec = r.record(wall_s=12.0)
    assert rec["step"] == rec["eval_version"] == 4 and "version" not in rec  # step readers skip it
    assert (rec["eval_success"], rec["eval_reward"], rec["eval_s"], rec["eval_drain_s"]) == (0.75, 0.75, 1.5, 0.25)
    registry = CollectorRegistry()
    m = create_metrics(registry)
    set_job_gauges(m, _spec(everySteps=1))
    assert registry.get_sample_value("asyncrl_eval_version") == -1
    count_eval(m, r)
    count_eval(m, EvalResult(8, 4, 4, 4.0, 30, 0.5, 0.0))
    value = registry.get_sample_value
    assert (value("asyncrl_eval_success"), value("asyncrl_eval_reward"), value("asyncrl_eval_version")) == (1, 1, 8)
    assert (value("asyncrl_eval_seconds_total"), value("asyncrl_eval_trajectories_total")) == (2.0, 8)
    steps = [{"step": v, "version": v, "applied": True, "success_rate": 0.1 * v, "reward_mean": 0.1 * v} for v in range(1, 9)]
    records = [EvalResult(0, 4, 1, 1.0, 9, 1.0, 0.0).record(1.0), *steps[:4], rec, *steps[4:],
               EvalResult(8, 4, 4, 4.0, 9, 0.5, 0.0).record(20.0)]
    s = summarise(records, wall_s=30.0).to_json()
    assert s["steps_done"] == 8 and s["final_version"] == 8  # evaluation records are not steps
    assert (s["eval_first"], s["eval_last"], s["eval_first_version"], s["eval_last_version"]) == (0.25, 1.0, 0, 8)
    assert [c["version"] for c in s["eval_curve"]] == [0, 4, 8] and s["eval_s"] == 3.0
    assert summarise(steps, 1.0).eval_first is None and summarise(steps, 1.0).eval_curve == ()
    text = format_summary(RunSummary.from_json({**s, "job": "q", "status": "succeeded"}))
    assert "success went from 25.0% to 100.0% (held-out evaluation, version 0 -> 8, 3 evaluations)" in text
    assert "success went from" not in format_summary(RunSummary.from_json(summarise(steps, 1.0).to_json()))


def test_report_plots_the_evaluation(tmp_path) -> None:
    import matplotlib.image

    steps = [{"step": v, "version": v, "applied": True, "success_rate": 0.1, "reward_mean": 0.1} for v in range(1, 5)]
    evals = [EvalResult(v, 4, v, float(v), 9, 0.1, 0.0).record(1.0) for v in (0, 2, 4)]
    with_eval, without = tmp_path / "a.png", tmp_path / "b.png"
    write_report([*steps, *evals], with_eval)
    write_report(steps, without)
    assert (matplotlib.image.imread(with_eval) != matplotlib.image.imread(without)).any()


def test_the_pending_cel_rule_refuses_what_the_model_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    # EVAL_SETTINGS_RULE joins EvalSpec.cel_rules once tests/support/bad_inputs.py has its row; until then
    # this proves it on the offline CRD validator: same path (spec.eval) and words as asyncrl validate.
    from asyncrl.api.crd import build_crd
    from asyncrl.api.evaluation import EVAL_SETTINGS_RULE
    from asyncrl.api.validation import SpecError, validate_job
    from tests.support.crvalidate import CRValidator

    monkeypatch.setattr(EvalSpec, "cel_rules", (EVAL_SETTINGS_RULE,))
    validator = CRValidator(build_crd())

    def manifest(eval_: dict[str, object]) -> dict[str, object]:
        return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob",
                "metadata": {"name": "j", "namespace": "default"}, "spec": {"eval": eval_}}

    bad = manifest({"prompts": 8})
    errors = validator.validate(bad)
    assert any(e.startswith("spec.eval: ") and EVAL_UNUSED_MESSAGE in e for e in errors), errors
    with pytest.raises(SpecError) as info:
        validate_job(bad)
    assert info.value.problems[0].path == "spec.eval" and EVAL_UNUSED_MESSAGE in info.value.problems[0].message
    for good in ({}, {"everySteps": 0}, {"everySteps": 3, "prompts": 8, "mode": "temperature", "seed": 2}):
        assert validator.validate(manifest(good)) == [], good
        validate_job(manifest(good))


def test_eval_curve_carries_training_seconds_without_the_evaluations_own_time() -> None:
    """Eval k's loop time = wall since eval 0 minus evals 1..k's seconds; the equal-wall-clock lookup
    takes the newest evaluation done by then (bench/async_speedup.py, bench/minibatches.py)."""
    evals = [EvalResult(0, 4, 1, 1.0, 9, 0.5, 0.0).record(10.0),   # loop starts after eval 0
             EvalResult(4, 4, 2, 2.0, 9, 1.0, 0.2).record(16.0),   # 6 s later, 1 s of it evaluating
             EvalResult(8, 4, 4, 4.0, 9, 2.0, 0.0).record(30.0)]   # 14 s later, 2 s evaluating
    assert eval_loop_seconds(parse_lines(evals)) == [0.0, 5.0, 17.0]  # type: ignore[arg-type]
    assert eval_loop_seconds([]) == []
    curve = summarise(evals, wall_s=31.0).to_json()["eval_curve"]
    assert [c["loop_s"] for c in curve] == [0.0, 5.0, 17.0]
    assert success_at_loop_seconds(curve, 4.9)["version"] == 0  # type: ignore[index]
    assert success_at_loop_seconds(curve, 5.0)["version"] == 4  # type: ignore[index]
    assert success_at_loop_seconds(curve, 100.0)["success"] == 1.0  # type: ignore[index]
    assert success_at_loop_seconds([{**curve[0], "loop_s": 1.0}], 0.5) is None
