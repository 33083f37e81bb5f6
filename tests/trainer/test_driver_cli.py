"""``asyncrl run``: argument handling and validation before anything heavy starts."""

import pytest

from asyncrl.trainer.cli import _load_run_job, main


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if the driver tries to start Ray."""
    import asyncrl.trainer.driver.loop as loop

    def refuse(*args, **kwargs):
        raise AssertionError("Ray must not start for a job that is refused")

    monkeypatch.setattr(loop, "local_ray", refuse)


def test_embedded_quickstart_is_packaged_and_valid():
    job = _load_run_job(None)
    assert job.metadata.name == "quickstart"


def test_invalid_job_is_rejected_before_ray_starts(tmp_path, capsys, no_ray):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: bad}\n"
        "spec:\n  async: {maxStaleness: -1}\n  train: {stepz: 3}\n"
    )
    assert main(["run", str(bad), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "spec.async.maxStaleness" in err and "spec.train.stepz" in err  # all problems at once
    assert not (tmp_path / "run").exists()


def test_missing_file_and_bad_steps(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert main(["run", "--steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "--steps must be >= 1" in err


def test_exact_strategies_not_yet_in_the_driver_are_refused_before_ray(tmp_path, capsys, no_ray):
    job = tmp_path / "exact.yaml"
    job.write_text(
        "apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: ex}\n"
        "spec:\n  correction: {reference: exact}\n  oldLogits: {strategy: interruptSync}\n"
    )
    for command in (["run", str(job), "--run-dir", str(tmp_path / "run")], ["driver", "--spec", str(job), "--local"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "oldLogits.strategy 'interruptSync' is not implemented" in err and "snapshot" in err
    assert not (tmp_path / "run").exists()


def test_an_engine_without_a_backend_is_refused_before_ray(tmp_path, capsys, no_ray):
    job = tmp_path / "vllm.yaml"
    job.write_text(
        "apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: v}\n"
        "spec:\n  rollout: {engine: vllm}\n"
    )
    assert main(["run", str(job), "--run-dir", str(tmp_path / "run")]) == 2
    assert "rollout.engine 'vllm' has no backend" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
