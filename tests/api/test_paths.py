"""Paths a job names (``asyncrl.api.paths``): checkpoint.dir stays inside what the job owns (the model and
the CRD's CEL rule agree on every value), and a weights folder that is not a model folder is named before
any process starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.api.crd import build_crd
from asyncrl.api.paths import CHECKPOINT_DIR_MESSAGE, checkpoint_dir_problem, weights_problem
from tests.support.crvalidate import CRValidator

INSIDE = ["checkpoints", "./ckpt", "a/b", "a/./b", "a..b/c", "/checkpoints", "/checkpoints/run-1"]
OUTSIDE = ["..", "../x", "../../x", "a/../../x", "a/..", "a/../b",  # no ".." at all: CEL cannot normalise
           "/etc", "/etc/ckpt", "/", "/checkpointsx", "/checkpoints/../etc", "/tmp/../checkpoints"]


@pytest.fixture(scope="module")
def crd_validator() -> CRValidator:
    return CRValidator(build_crd())


@pytest.mark.parametrize("value", INSIDE + OUTSIDE)
def test_checkpoint_dir_rule_is_the_same_in_the_model_and_the_crd(value: str, crd_validator: CRValidator) -> None:
    problem = checkpoint_dir_problem(value)
    crd = crd_validator.validate({
        "apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "p", "namespace": "default"},
        "spec": {"checkpoint": {"dir": value}}})
    assert (problem is None) == (value in INSIDE) == (crd == []), (value, problem, crd)
    if problem is not None:
        assert problem.startswith(CHECKPOINT_DIR_MESSAGE) and repr(value) in problem
        assert any(CHECKPOINT_DIR_MESSAGE in e for e in crd)


def test_an_escape_names_where_it_would_land() -> None:
    assert checkpoint_dir_problem("a/../../x") == f"{CHECKPOINT_DIR_MESSAGE} (got 'a/../../x', which normalises to '../x')"


def _folder(tmp_path: Path, *files: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    for name in files:
        (folder / name).write_text("{}")
    return folder


def test_weights_problems_name_the_file_looked_for(tmp_path: Path) -> None:
    missing = tmp_path / "not-pulled"
    assert weights_problem(str(missing)) == (
        f"{str(missing)!r}: no such folder here (looked for {missing / 'config.json'}); give the folder that "
        "save_pretrained wrote, or the one 'asyncrl models pull NAME' prints (e.g. asyncrl models pull smollm2)")
    a_file = tmp_path / "weights.safetensors"
    a_file.write_text("x")
    assert f"is a file, not a model folder (looked for {a_file / 'config.json'})" in str(weights_problem(str(a_file)))
    empty = _folder(tmp_path, "README")  # like /etc: a folder, but no model in it
    assert f"it has no config.json (looked for {empty / 'config.json'}) and no *.safetensors" in str(
        weights_problem(str(empty)))


def test_model_folders_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert weights_problem(str(_folder(tmp_path, "config.json"))) is None
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "model.safetensors").write_text("x")  # a preset's bare weights, as before
    assert weights_problem(str(tmp_path / "bare")) is None
    monkeypatch.setenv("HOME", str(tmp_path))
    assert weights_problem("~/model") is None  # pulled models live in a user cache


def _job(tmp_path: Path, weights: Path) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text("apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: w}\n"
                   f"spec:\n  model: {{preset: tiny-llama, weights: {json.dumps(str(weights))}}}\n")
    return job


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = ("import sys; from asyncrl.trainer.cli import main; rc = main(sys.argv[1:]); "
            "print('ray imported:', 'ray' in sys.modules); sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_validate_warns_about_a_folder_missing_here_and_refuses_it_with_local(tmp_path: Path) -> None:
    job = _job(tmp_path, tmp_path / "in-the-pvc")
    run = _cli("validate", str(job))
    assert run.returncode == 0, run.stderr  # a cluster job reads its folder in its pods
    assert f"{job}: warning: spec.model.weights: " in run.stderr and "looked for" in run.stderr
    assert f"{job}: AsyncRLJob w is valid" in run.stdout
    local = _cli("validate", "--local", str(job))
    assert local.returncode == 1 and f"{job}: spec.model.weights: " in local.stderr
    assert "AsyncRLJob w is valid" not in local.stdout


def test_run_refuses_a_folder_without_a_model_before_ray(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "passwd")  # /etc, in miniature
    run = _cli("run", str(_job(tmp_path, folder)), "--run-dir", str(tmp_path / "run"))
    assert run.returncode == 2, run.stderr
    assert f"spec.model.weights: {str(folder)!r} is not a model folder: it has no config.json (looked for " \
           f"{folder / 'config.json'})" in run.stderr
    assert "ray imported: False" in run.stdout and "Traceback" not in run.stderr
    assert not (tmp_path / "run").exists()
