"""End to end: a tiny job for a few steps on a local Ray, with the real rollout workers and actor.

Checks the invariants of docs/architecture.md, the path of one token on what actually reaches the actor: every trained
token carries a version, no token is older than ``async.maxStaleness``, partial rollouts happen
(trajectories spanning two versions), environment tokens are never trained, the loss is finite,
and the driver's ``/metrics`` endpoint serves the whole catalogue over HTTP.
"""

import math
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncrl.api.validation import validate_job
from asyncrl.rollout.trajectory import NO_VERSION
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
from asyncrl.trainer.driver.run.metrics import CATALOGUE

W = 2
JOB = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "e2e"},
    "spec": {
        "correction": {"reference": "current"},
        "async": {"maxStaleness": W, "partialRollout": True},
        "task": {"name": "calculator", "groupSize": 4, "maxNewTokens": 24},
        "train": {"steps": 5, "promptsPerStep": 4, "warmStartSteps": 3},
        "rollout": {"replicas": 2},
        "checkpoint": {"everySteps": 5},
    },
}


@pytest.fixture(scope="module")
def run(ray_session, tmp_path_factory):
    job = validate_job(JOB)
    batches, scraped = [], {}

    def on_batch(groups, version):
        batches.append((version, [t for g in groups for t in g]))

    def on_start(info):
        scraped["url"] = info["metrics_url"]

    def on_step(record):
        if getattr(record, "version", None) == 2:  # scrape mid-run, while the loop is live
            scraped["body"] = urllib.request.urlopen(scraped["url"], timeout=10).read().decode()

    result = run_job(job, RunOptions(run_dir=tmp_path_factory.mktemp("run"), port=0),
                     on_step=on_step, on_start=on_start, on_batch=on_batch)
    return result, batches, scraped


def test_a_rerun_resumes_from_the_checkpoint(run):
    first, _, _ = run
    assert (first.run_dir / "checkpoints" / "step-000005" / "meta.json").exists()
    again = run_job(validate_job(JOB), RunOptions(run_dir=first.run_dir, steps=6, port=0))
    assert again.summary.resumed_from.endswith("step-000005")
    assert again.summary.warm_start is None  # resumed weights, no second warm start
    assert [r["version"] for r in again.steps] == [1, 2, 3, 4, 5, 6]  # the log continues
    assert len(again.run_dir.joinpath("metrics.jsonl").read_text().splitlines()) == 6
    # The last step is checkpointed too, so rerunning a finished job has nothing to redo.
    assert (first.run_dir / "checkpoints" / "step-000006" / "meta.json").exists()


def test_versions_are_stamped_and_within_the_staleness_bound(run):
    _, batches, _ = run
    assert [v for v, _ in batches] == [0, 1, 2, 3, 4]
    for actor_version, trajs in batches:
        for t in trajs:
            trained = [v for v, m in zip(t.versions, t.loss_mask, strict=True) if m]
            assert trained, t.traj_id
            assert all(0 <= v <= actor_version for v in trained), (t.traj_id, trained, actor_version)
            assert actor_version - min(trained) <= W, (t.traj_id, trained, actor_version)


def test_some_trajectories_span_two_versions(run):
    result, batches, _ = run
    partial = [t for _, trajs in batches for t in trajs if t.is_partial]
    assert partial, "no partial rollout happened: weight updates never reached a generating worker"
    assert any(r["staleness_max"] >= 1 for r in result.steps)


def test_environment_tokens_are_never_trained(run):
    _, batches, _ = run
    env_tokens = 0
    for _, trajs in batches:
        for t in trajs:
            for i, (v, m) in enumerate(zip(t.versions, t.loss_mask, strict=True)):
                if v == NO_VERSION:
                    assert not m, (t.traj_id, i)
                    env_tokens += i >= t.prompt_len
    assert env_tokens > 0  # the calculator task does answer tool calls


def test_loss_is_finite_and_run_dir_is_complete(run):
    result, _, _ = run
    assert len(result.steps) == 5
    assert all(math.isfinite(r["loss"]) for r in result.steps)
    assert result.summary.status == "succeeded" and result.summary.totals.final_version == 5
    for name in ("metrics.jsonl", "summary.json", "report.png", "job.yaml"):
        assert (result.run_dir / name).exists(), name


def test_metrics_endpoint_serves_the_catalogue(run):
    _, _, scraped = run
    assert scraped["url"].startswith("http://127.0.0.1:")
    body = scraped["body"]
    samples = {s.name: s for f in text_string_to_metric_families(body) for s in f.samples}
    for d in CATALOGUE:
        assert (d.name + "_bucket" if d.kind == "histogram" else d.name) in samples, d.name
    assert samples["asyncrl_policy_version"].value >= 2
