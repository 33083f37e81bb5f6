"""``actor.weightSync.transport`` broadcast and disk in the real job (``asyncrl`` driver, local Ray, real
processes): the job finishes and rollout generates under the new versions. A worker replaced mid-run under
broadcast is tested in test_driver_faults (its killed-worker job runs on broadcast), the dedicated scorers and
interrupt-sync receiving by broadcast in test_e2e_exact (their jobs run on broadcast)."""

import copy
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.api.weight_sync import WeightTransport
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
from asyncrl.trainer.driver.loop.weight_sync import disk_keep
from asyncrl.trainer.weight_sync import disk

JOB: dict[str, Any] = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "ws-job"},
    "spec": {
        "async": {"maxStaleness": 1},
        "task": {"name": "calculator", "groupSize": 2, "maxNewTokens": 12},
        "train": {"steps": 3, "promptsPerStep": 2, "warmStartSteps": 0},
        "rollout": {"replicas": 2},
        "monitoring": {"enabled": False},
    },
}


def _job(transport: str, **spec: Any) -> dict[str, Any]:
    job = copy.deepcopy(JOB)
    job["metadata"]["name"] = f"ws-{transport.lower()}"
    job["spec"]["actor"] = {"weightSync": {"transport": transport, "bucketMiB": 1}}  # many buckets per version
    job["spec"].update(spec)
    return job


class _Versions:
    """The versions rollout stamped on the tokens of every batch the actor trained on."""

    def __init__(self) -> None:
        self.seen: list[set[int]] = []

    def __call__(self, groups: list[Any], version: int) -> None:
        self.seen.append({v for g in groups for t in g for v in t.sampled_versions})


def _run(job: dict[str, Any], run_dir: Path, **kw: Any) -> tuple[Any, _Versions]:
    versions = _Versions()
    result = run_job(validate_job(job), RunOptions(run_dir=run_dir), on_batch=versions, **kw)
    assert result.summary.status == "succeeded", result.summary
    return result, versions


def _check_learned_and_synced(result: Any, versions: _Versions, steps: int) -> None:
    applied = [r for r in result.steps if "version" in r]
    assert [r["version"] for r in applied] == list(range(1, steps + 1))
    for r in applied:
        assert r["sync_bytes"] > 0 and r["sync_transfer_s"] >= 0 and r["sync_pause_s"] >= 0, r
    # Rollout took the new versions: the later batches hold tokens generated after version 0.
    assert max(max(s) for s in versions.seen) >= 1, versions.seen


def test_spec_accepts_every_transport() -> None:
    for t in WeightTransport:
        assert validate_job(_job(t.value)).spec.actor.weight_sync.transport is t
    dedicated = validate_job(_job("disk", correction={"reference": "exact"},
                                  oldLogits={"strategy": "dedicated", "dedicated": {"maxLagVersions": 2}})).spec
    assert disk_keep(dedicated) == 2 + 2 + 1  # newest + being written + maxLagVersions + W
    assert disk_keep(validate_job(_job("disk")).spec) == 2


@pytest.mark.slow  # a 3-step job on local Ray: ~1 min on loaded cores
def test_broadcast_job_finishes_and_rollout_follows_the_versions(ray_session: None, tmp_path: Path) -> None:
    result, versions = _run(_job("broadcast"), tmp_path / "run")
    _check_learned_and_synced(result, versions, 3)


@pytest.mark.slow
def test_disk_job_finishes_and_keeps_only_the_loadable_versions(ray_session: None, tmp_path: Path) -> None:
    result, versions = _run(_job("disk"), tmp_path / "run")
    _check_learned_and_synced(result, versions, 3)
    root = tmp_path / "run" / "checkpoints" / "weight-sync"
    assert disk.versions(root) == [2, 3]  # keep 2: the newest and the one before
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp")]
