"""`asyncrl validate` and the spec models: every problem with its field path and a fix."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.api import AsyncRLJobSpec, Bounds, SpecError, validate_job
from asyncrl.api.crd import all_spec_models

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def _job(spec: dict) -> dict:
    return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "t"}, "spec": spec}


def _problems(spec: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_job(_job(spec))
    return {p.path: p.message for p in info.value.problems}


def test_quickstart_validates_and_defaults_fill_in() -> None:
    (doc,) = list(yaml.safe_load_all(QUICKSTART.read_text()))
    job = validate_job(doc)
    assert job.spec.async_.max_staleness == 2
    # decay auto = W/(W+2) = 2/4
    assert job.spec.ewma_decay == pytest.approx(0.5)
    assert job.spec.correction.mask.bounds == Bounds(low=0.5, high=2.0)


def test_single_number_bound_means_reciprocal_interval() -> None:
    spec = AsyncRLJobSpec.model_validate({"correction": {"mask": {"bounds": 4}}})
    assert spec.correction.mask.bounds.low == pytest.approx(0.25)  # 1/4
    assert spec.correction.mask.bounds.high == pytest.approx(4.0)


def test_every_problem_reported_at_once_with_paths() -> None:
    problems = _problems(
        {
            "correction": {
                "reference": "ewmaa",
                "mask": {"bounds": {"low": 1.2, "high": 3.0}, "levle": "token"},
                "clip": {"low": 1.5},
                "ewma": {"decay": 1.0},
            },
            "async": {"maxStaleness": -1},
        }
    )
    assert "expected one of" in problems["spec.correction.reference"]
    assert "'behavior'" in problems["spec.correction.reference"]
    assert "low < 1 < high" in problems["spec.correction.mask.bounds"]
    assert "did you mean 'level'" in problems["spec.correction.mask.levle"]
    assert "less than 1" in problems["spec.correction.clip.low"]
    assert "(0, 1)" in problems["spec.correction.ewma"]
    assert "greater than or equal to 0" in problems["spec.async.maxStaleness"]


def test_exact_reference_needs_a_strategy() -> None:
    problems = _problems({"correction": {"reference": "exact"}})
    (msg,) = problems.values()
    assert "oldLogits.strategy" in msg and "snapshot" in msg


def test_strategy_without_exact_is_refused() -> None:
    problems = _problems({"oldLogits": {"strategy": "snapshot"}})
    (msg,) = problems.values()
    assert "reference: exact" in msg


def test_bad_single_number_bound() -> None:
    problems = _problems({"correction": {"mask": {"bounds": 0.5}}})
    assert "c > 1" in problems["spec.correction.mask.bounds"]


def test_gqa_heads_must_divide() -> None:
    problems = _problems({"model": {"numAttentionHeads": 6, "numKeyValueHeads": 4}})
    assert "multiple of numKeyValueHeads" in problems["spec.model"]


def test_bad_name_and_kind() -> None:
    with pytest.raises(SpecError) as info:
        validate_job({**_job({}), "metadata": {"name": "Bad_Name"}})
    assert info.value.problems[0].path == "metadata.name"
    with pytest.raises(SpecError) as info:
        validate_job({**_job({}), "kind": "Pod"})
    assert "expected apiVersion: asyncrl.io/v1alpha1 and kind: AsyncRLJob" in str(info.value)


def test_every_field_has_a_description() -> None:
    missing = [
        f"{model.__name__}.{name}"
        for model in all_spec_models()
        for name, field in model.model_fields.items()
        if not field.description
    ]
    assert missing == []


def test_cli_validate_exit_codes_and_lines(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_job({"correction": {"clip": {"high": -1}, "mask": {"mode": "hard"}}})))
    run = subprocess.run(
        [sys.executable, "-m", "asyncrl.trainer.cli", "validate", str(QUICKSTART), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert "AsyncRLJob quickstart is valid" in run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 2, run.stderr
    assert any("spec.correction.clip.high:" in line and "greater than 0" in line for line in lines)
    assert any("spec.correction.mask.mode:" in line and "expected one of" in line for line in lines)
    assert all(line.startswith(str(bad)) for line in lines)
