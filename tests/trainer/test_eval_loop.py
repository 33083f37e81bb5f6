"""End to end: a tiny job with ``spec.eval`` on a local Ray (real rollout workers and actor).

Eval isolation: the evaluation never trains (no batch, no version, its prompts never in a training
group), never consumes admission capacity, and sees exactly the version it reports; its numbers
reach metrics.jsonl, Prometheus and summary.json.
"""

import copy
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncrl.api.validation import validate_job
from asyncrl.rollout.envs.registry import get_task
from asyncrl.rollout.envs.split import is_heldout
from asyncrl.trainer.driver.loop.evaluation import EvalResult
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

EVERY, PROMPTS, STEPS = 2, 6, 5
JOB: dict[str, Any] = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "e2e-eval"},
    "spec": {
        "correction": {"reference": "current"},
        "async": {"maxStaleness": 1, "partialRollout": True},
        "task": {"name": "calculator", "groupSize": 4, "maxNewTokens": 24},
        "train": {"steps": STEPS, "promptsPerStep": 4, "warmStartSteps": 0},
        "eval": {"everySteps": EVERY, "prompts": PROMPTS, "seed": 11},
        "rollout": {"replicas": 2},
        "checkpoint": {"everySteps": 50},
    },
}
# the default suite runs the plain loop; interrupt-sync (suspended episodes across the eval) in make test-slow
VARIANTS = ["plain", pytest.param("interruptSync", marks=pytest.mark.slow)]


def _scrape(url: str) -> dict[str, float]:
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples if not s.labels}


@pytest.fixture(scope="module", params=VARIANTS)
def run(ray_session: None, request, tmp_path_factory):
    job = copy.deepcopy(JOB)
    if request.param == "interruptSync":
        job["spec"]["correction"] = {"reference": "exact"}
        job["spec"]["oldLogits"] = {"strategy": "interruptSync"}
    trained: list[Any] = []
    scraped: list[tuple[Any, dict[str, float]]] = []  # (StepReport or EvalResult, /metrics then)
    url: dict[str, str] = {}

    def on_batch(groups, version):
        trained.append((version, [t for g in groups for t in g]))

    def on_step(record):
        scraped.append((record, _scrape(url["metrics"])))

    result = run_job(validate_job(job), RunOptions(run_dir=tmp_path_factory.mktemp("eval"), port=0),
                     on_step=on_step, on_batch=on_batch,
                     on_start=lambda info: url.setdefault("metrics", info["metrics_url"]))
    assert result.summary.status == "succeeded", result.summary
    return result, trained, scraped


def test_evaluations_run_at_the_start_every_n_versions_and_at_the_end_without_advancing(run):
    result, trained, _ = run
    kinds = [("eval", r["eval_version"]) if "eval_version" in r else ("step", r["version"]) for r in result.steps]
    # version 0 before training, then after the step (and weight sync) that made 2, 4, and the last one 5
    assert kinds == [("eval", 0), ("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("step", 4), ("eval", 4),
                     ("step", 5), ("eval", 5)]
    assert [v for v, _ in trained] == [0, 1, 2, 3, 4]  # one batch per version: the evaluation trained nothing
    assert all(r["eval_prompts"] == PROMPTS and 0 <= r["eval_success"] <= 1 for r in result.steps if "eval_s" in r)


def test_evaluation_prompts_never_reach_a_training_group(run):
    _, trained, _ = run
    heldout = {p.question for p in get_task("calculator").heldout_problems(PROMPTS, seed=11)}
    questions = {t.info["question"] for _, trajs in trained for t in trajs}
    assert len(questions) >= STEPS * 4 - 2  # ~4 fresh problems per batch (a redraw may repeat one)
    assert not any(is_heldout(q) for q in questions) and questions.isdisjoint(heldout)
    assert not any(t.traj_id.startswith("eval-") for _, trajs in trained for t in trajs)


def test_evaluation_takes_no_admission_capacity_and_reports_what_it_saw(run):
    result, _, scraped = run
    evals = 0
    for i, (rec, now) in enumerate(scraped):  # (record, /metrics scraped when the record was written)
        if not isinstance(rec, EvalResult):
            continue
        evals += 1
        assert now["asyncrl_eval_version"] == rec.version
        assert now["asyncrl_eval_success"] == pytest.approx(rec.success)
        assert now["asyncrl_eval_reward"] == pytest.approx(rec.reward)
        assert now["asyncrl_eval_trajectories_total"] == PROMPTS * evals
        assert now["asyncrl_policy_version"] == rec.version  # it saw the version it reports
        if i > 0:  # right after the step that made this version
            step, then = scraped[i - 1]
            assert step.version == rec.version
            # nothing was admitted during the evaluation: the capacity left is what the step left
            assert now["asyncrl_admission_capacity_groups"] == then["asyncrl_admission_capacity_groups"]
    assert evals == 4
    buf = result.summary.buffer
    # every admitted group is accounted for by training: the evaluation reserved none
    # (calls in flight at the end are aborted by the drain: counted in groups_aborted; interrupt-sync leaves
    # groups whose members are still suspended in their workers)
    assert buf["groups_admitted"] == (buf["groups_consumed"] + buf["groups_dropped_stale"] + buf["groups_aborted"]
                                      + buf["groups_left_unused"] + buf["groups_suspended_at_end"])


def test_summary_and_run_dir_carry_the_evaluation(run):
    result, _, _ = run
    s = result.summary.to_json()  # summary.json's form
    curve = [r for r in result.steps if "eval_version" in r]
    assert [c["version"] for c in s["eval_curve"]] == [0, 2, 4, 5]
    assert s["eval_first"] == round(curve[0]["eval_success"], 4) and s["eval_last"] == round(curve[-1]["eval_success"], 4)
    assert s["loop"]["eval_s"] == pytest.approx(s["eval_s"], abs=0.01) and s["eval_s"] > 0
    assert s["loop"]["eval_s"] < s["loop"]["wall_s"]
    assert (result.run_dir / "report.png").exists()
    logged = [line for line in (result.run_dir / "metrics.jsonl").read_text().splitlines() if "eval_version" in line]
    assert len(logged) == 4
