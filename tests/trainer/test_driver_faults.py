"""Faults a running job survives, for real: a rollout worker's process killed mid-run, and the
whole job killed and resumed from its checkpoint (local Ray, real processes)."""

import logging
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
from tests.support.kill_worker import kill_at_version

pytestmark = pytest.mark.slow  # real processes killed mid-run: about 5 minutes on 2 cores

JOB: dict[str, Any] = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "faults"},
    "spec": {
        "async": {"maxStaleness": 1},
        "task": {"name": "calculator", "groupSize": 2, "maxNewTokens": 16},
        "train": {"steps": 6, "promptsPerStep": 2, "warmStartSteps": 0},
        "rollout": {"replicas": 2},
        "checkpoint": {"everySteps": 2},
        "monitoring": {"enabled": False},
    },
}


def test_a_killed_rollout_worker_is_replaced_and_the_job_finishes(ray_session: None, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Under the broadcast transport, the hardest case for a replacement: it must get the current version and
    the group must take it in again (one test for both: this and test_weightsync_job ran the same kill)."""
    on_step, killed = kill_at_version(2, expect=2)

    caplog.set_level(logging.INFO, logger="asyncrl.trainer.driver.loop.weight_sync")
    job = {**JOB, "spec": {**JOB["spec"], "actor": {"weightSync": {"transport": "broadcast", "bucketMiB": 1}}}}
    seen: list[set[int]] = []
    result = run_job(validate_job(job), RunOptions(run_dir=tmp_path / "run"), on_step=on_step,
                     on_batch=lambda groups, v: seen.append({x for g in groups for t in g for x in t.sampled_versions}))
    s = result.summary.to_json()  # summary.json's form
    assert killed and s["status"] == "succeeded", s
    assert [r["version"] for r in result.steps if "version" in r] == [1, 2, 3, 4, 5, 6]
    assert s["worker_replacements"] == 1, s
    for r in result.steps:
        if "version" in r:
            assert r["sync_bytes"] > 0 and r["sync_transfer_s"] >= 0 and r["sync_pause_s"] >= 0, r
    assert max(max(v) for v in seen) >= 1, seen  # rollout sampled under the new versions
    assert "broadcast group formed again" in caplog.text  # the replacement joined before a later version
    # Its in-flight groups were counted as aborted (or it was idle); every admitted group is accounted for
    # (the calls still in flight at the end are aborted by the drain, so they are in groups_aborted too).
    b = s["buffer"]
    assert b["groups_admitted"] == b["groups_accepted"] + b["groups_aborted"], b
    assert b["groups_aborted"] >= b["groups_in_flight_at_end"], b


def test_kill_and_resume_continues_the_versions_without_replaying_prompts(ray_session: None, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first: list[str] = []
    second: list[str] = []

    def stop_after_3(r: Any) -> None:
        if getattr(r, "version", None) == 3:
            raise KeyboardInterrupt  # the job dies after the checkpoint at 2, with step 3 not saved

    with pytest.raises(KeyboardInterrupt):
        run_job(validate_job(JOB), RunOptions(run_dir=run_dir), on_step=stop_after_3,
                on_batch=lambda groups, v: first.extend(g[0].group_id for g in groups if v < 2))
    result = run_job(validate_job(JOB), RunOptions(run_dir=run_dir),
                     on_batch=lambda groups, v: second.extend(g[0].group_id for g in groups))
    s = result.summary.to_json()  # summary.json's form
    assert s["status"] == "succeeded" and s["start_version"] == 2, s
    assert [r["version"] for r in result.steps if "version" in r] == [1, 2, 3, 4, 5, 6]
    # Steps 1-2 are in the checkpoint; steps 3-6 were trained after the resume on fresh prompts.
    assert len(first) == 4 and len(second) == 8
    assert not set(first) & set(second), "a prompt group trained before the checkpoint was trained again"
    assert len(set(second)) == len(second)
    assert s["resume"]["cursors"] and all(c > 0 for c in s["resume"]["cursors"]), s["resume"]


def test_a_killed_dedicated_scorer_is_replaced_and_nothing_is_lost(ray_session: None, tmp_path: Path) -> None:
    job = {**JOB, "spec": {**JOB["spec"], "correction": {"reference": "exact"},
                           "oldLogits": {"strategy": "dedicated"}, "model": {"rolloutDtype": "float32"},
                           "train": {**JOB["spec"]["train"], "steps": 5}}}
    on_step, killed = kill_at_version(2, expect=1, title="ray::DedicatedScorer")

    result = run_job(validate_job(job), RunOptions(run_dir=tmp_path / "run"), on_step=on_step)
    s = result.summary.to_json()  # summary.json's form
    assert killed and s["status"] == "succeeded", s
    assert [r["version"] for r in result.steps if "version" in r] == [1, 2, 3, 4, 5]
    assert s["dedicated"]["replacements"] == 1, s["dedicated"]
    for r in result.steps:  # every older token still got its exact pi_old (fp32 engine: r_d == 1)
        assert abs(r["rd_min"] - 1.0) < 1e-3 and abs(r["rd_max"] - 1.0) < 1e-3, r
