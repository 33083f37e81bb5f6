"""`asyncrl validate` and the spec models: every problem with its field path and a fix.

The table of bad inputs (tests/support/bad_inputs.py) runs through the model here and through the
shipped CRD offline (schema + CEL by cel-python); the real-server suite runs the same table.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.api import AsyncRLJobSpec, SpecError, validate_job
from asyncrl.api.crd import all_spec_models, build_crd
from tests.support.bad_inputs import BAD_INPUTS, BASE_SPEC, GOOD_INPUTS, BadInput, bad_manifest, good_manifest
from tests.support.crvalidate import CRValidator

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def _job(spec: dict) -> dict:
    return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "t"}, "spec": spec}


def _problems(spec: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_job(_job(spec))
    return {p.path: p.message for p in info.value.problems}


@pytest.fixture(scope="module")
def crd_validator() -> CRValidator:
    return CRValidator(build_crd())


def test_quickstart_validates_and_defaults_fill_in() -> None:
    (doc,) = list(yaml.safe_load_all(QUICKSTART.read_text()))
    job = validate_job(doc)
    assert job.spec.async_.max_staleness == 2
    assert job.spec.correction.ewma.decay is None
    assert job.spec.ewma_decay == pytest.approx(0.5)  # omitted: W/(W+2) = 2/4
    bounds = job.spec.correction.mask.bounds
    assert (bounds.low, bounds.high) == (0.5, 2.0)


def test_factor_bound_means_reciprocal_interval_and_round_trips() -> None:
    spec = AsyncRLJobSpec.model_validate({"correction": {"mask": {"bounds": {"factor": 4}}}})
    bounds = spec.correction.mask.bounds
    assert bounds.low == pytest.approx(0.25)  # 1/4
    assert bounds.high == pytest.approx(4.0)
    # written back in the form it was given, so the dump validates again (job.yaml in the run dir)
    assert spec.to_spec_dict()["correction"]["mask"]["bounds"] == {"factor": 4.0}
    assert AsyncRLJobSpec.model_validate(spec.to_spec_dict()) == spec


def test_explicit_decay_and_window() -> None:
    spec = AsyncRLJobSpec.model_validate({"correction": {"ewma": {"decay": 0.9}}, "async": {"maxStaleness": 6}})
    assert spec.ewma_decay == 0.9
    spec = AsyncRLJobSpec.model_validate({"async": {"maxStaleness": 6}})
    assert spec.ewma_decay == pytest.approx(6 / 8)  # W/(W+2)


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
    assert "0 < low < 1 < high" in problems["spec.correction.mask.bounds"]
    assert "did you mean 'level'" in problems["spec.correction.mask.levle"]
    assert "less than 1" in problems["spec.correction.clip.low"]
    assert "strictly between 0 and 1" in problems["spec.correction.ewma.decay"]
    assert "greater than or equal to 0" in problems["spec.async.maxStaleness"]


def test_the_base_of_the_table_is_valid_everywhere(crd_validator: CRValidator) -> None:
    good = bad_manifest(BadInput("none", {}, "", ""), "good-job")
    validate_job(good)
    assert crd_validator.validate(good) == []
    assert good["spec"] == BASE_SPEC


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda c: c.id)
def test_bad_input_is_refused_by_validate_at_its_path(case: BadInput) -> None:
    with pytest.raises(SpecError) as info:
        validate_job(bad_manifest(case, "bad-job"))
    problems = info.value.problems
    # exactly one thing is broken, so exactly one problem, at the table's path
    assert [p.path for p in problems] == [case.path], problems
    assert case.message in problems[0].message
    assert case.cli_message in problems[0].message


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda c: c.id)
def test_bad_input_is_refused_by_the_crd_at_its_path(case: BadInput, crd_validator: CRValidator) -> None:
    errors = crd_validator.validate(bad_manifest(case, "bad-job"))
    at_path = [e for e in errors if e.startswith(f"{case.path}: ")]
    assert at_path, errors
    assert any(case.message in e for e in at_path), errors


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda c: c.id)
def test_bad_input_is_refused_by_the_operator_before_it_builds_anything(case: BadInput) -> None:
    # what the reconcile parses (the object as the server stored it): a SpecError marks the job
    # ValidationFailed and no child is built (a spec past the CRD, e.g. written before a stricter CRD)
    from asyncrl.operator.reconcile import parse_spec

    refused = parse_spec(bad_manifest(case, "bad-job"))
    assert isinstance(refused, SpecError)
    assert [p.path for p in refused.problems] == [case.path], refused.problems
    assert case.message in refused.problems[0].message


def test_every_cel_rule_of_the_crd_has_a_bad_input() -> None:
    messages = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            messages.extend(r["message"] for r in node.get("x-kubernetes-validations", [])
                            if "oldSelf" not in r["rule"])  # transition rules: tests/api/test_crd.py
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(build_crd())
    assert messages
    uncovered = [m for m in messages if not any(c.message and c.message in m for c in BAD_INPUTS)]
    assert uncovered == []


@pytest.mark.parametrize("spec", [s for _, s in GOOD_INPUTS], ids=[i for i, _ in GOOD_INPUTS])
def test_good_input_is_accepted_by_validate_and_the_crd(spec: dict, crd_validator: CRValidator) -> None:
    manifest = good_manifest(spec, "good-job")
    validate_job(manifest)
    assert crd_validator.validate(manifest) == []


def test_every_strategy_runs_and_its_knobs_reach_the_spec() -> None:
    from asyncrl.api.old_logits import RUNNABLE_STRATEGIES, OldLogitStrategy, SnapshotDevice

    assert set(RUNNABLE_STRATEGIES) == set(OldLogitStrategy)
    spec = validate_job(good_manifest(dict(GOOD_INPUTS)["snapshot-on-disk"], "j")).spec
    assert spec.old_logits.snapshot.device is SnapshotDevice.DISK
    assert spec.snapshot_versions == 3  # auto: W+1 with the default W = 2
    capped = validate_job(good_manifest(dict(GOOD_INPUTS)["snapshot-cap-at-window"], "j")).spec
    assert capped.snapshot_versions == 4
    audited = validate_job(good_manifest(dict(GOOD_INPUTS)["audit-ewma"], "j")).spec.correction.audit
    assert audited.enabled and audited.every_n_steps == 10 and audited.fraction == 0.5
    assert not AsyncRLJobSpec().correction.audit.enabled  # off by default


def test_max_versions_error_names_both_fields_and_the_fix() -> None:
    problems = _problems({"correction": {"reference": "exact"}, "async": {"maxStaleness": 4},
                          "oldLogits": {"strategy": "snapshot", "snapshot": {"maxVersions": 4}}})
    msg = problems["spec.oldLogits.snapshot.maxVersions"]
    assert "maxVersions=4 with async.maxStaleness=4 (W+1 = 5)" in msg
    assert "set maxVersions to 0 (auto) or >= W+1" in msg


def test_table_covers_the_new_refusals_and_is_large() -> None:
    assert len(BAD_INPUTS) >= 25
    assert len({c.id for c in BAD_INPUTS}) == len(BAD_INPUTS)


def test_engine_args_are_checked_against_the_transformers_engine() -> None:
    # engineArgs is free-form in the CRD (no CEL rule may touch it): the model alone checks it.
    problems = _problems({"rollout": {"engineArgs": {"gpu-memory-utilization": "0.8"}}})
    assert "fp32Head" in problems["spec.rollout.engineArgs"]
    spec = AsyncRLJobSpec.model_validate({"rollout": {"engineArgs": {"fp32Head": True}}})
    assert spec.rollout.engine_args == {"fp32Head": True}


def test_env_needs_exactly_one_of_value_and_value_from() -> None:
    both = {"name": "TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    problems = _problems({"rollout": {"template": {"env": [both, {"name": "EMPTY"}]}}})
    assert "exactly one of value and valueFrom" in problems["spec.rollout.template.env[0]"]
    assert "exactly one of value and valueFrom" in problems["spec.rollout.template.env[1]"]
    ok = AsyncRLJobSpec.model_validate({"actor": {"template": {"env": [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}, {"name": "MODE", "value": "1"},
    ]}}})
    assert [e.name for e in ok.actor.template.env] == ["TOKEN", "MODE"]


def test_pod_overrides_for_private_clusters() -> None:
    spec = AsyncRLJobSpec.model_validate({"rollout": {"template": {
        "imagePullSecrets": [{"name": "registry"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
        "securityContext": {"readOnlyRootFilesystem": True},
        "podSecurityContext": {"fsGroup": 2000},
        "volumes": [{"name": "data", "emptyDir": {}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }}, "runPolicy": {"preemptionLimit": 0}, "scheduling": {"gangScheduler": "volcano"}})
    t = spec.rollout.template
    assert t.image_pull_secrets[0].name == "registry" and t.volume_mounts[0].read_only is False
    assert t.pod_security_context is not None and t.pod_security_context.fs_group == 2000 and t.affinity is not None
    assert spec.run_policy.preemption_limit == 0 and spec.scheduling.gang_scheduler == "volcano"
    defaults = AsyncRLJobSpec()
    assert defaults.run_policy.preemption_limit == 10 and defaults.scheduling.gang_scheduler == "none"


def test_bad_name_and_kind() -> None:
    with pytest.raises(SpecError) as info:
        validate_job({**_job({}), "metadata": {"name": "Bad_Name"}})
    assert info.value.problems[0].path == "metadata.name"
    assert "RFC 1035" in info.value.problems[0].message
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
