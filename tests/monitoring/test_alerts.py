"""The alert rules as Prometheus runs them: taken from the rendered chart, checked and unit-tested by promtool.

Every alert has cases where it fires (for exactly the jobs that should) and where it must not
(healthy series of several jobs, or before its ``for`` has elapsed). Annotations are checked for
shape and runbook here; promtool's unit tests compare expressions, ``for`` and labels (they are
stripped before ``promtool test rules``, whose ``exp_annotations`` would otherwise need every
rendered sentence).
"""

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "asyncrl"
if str(ROOT) not in sys.path:  # tests.support lives at the repository root
    sys.path.insert(0, str(ROOT))
from tests.support.helpers import find_helm  # noqa: E402

NS = "rl"
SCRAPE = 'job="asyncrl-jobs", role="driver"'  # what the PodMonitor's relabelling adds besides identity


def rendered_groups(*values: str) -> list[dict[str, Any]]:
    """``spec.groups`` of the chart's PrometheusRule, rendered by helm with ``--set`` ``values``."""
    helm = find_helm()
    if helm is None:
        pytest.fail("helm v3 not found in .tools/helm/helm or on PATH; run `make tools`", pytrace=False)
    args = [helm, "template", "rel", str(CHART), "-n", "ops", "--set", "prometheusRule.enabled=true"]
    for v in values:
        args += ["--set", v]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (rule,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "PrometheusRule"]
    return rule["spec"]["groups"]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found; run `make tools` (Debian package prometheus)", pytrace=False)
    return path


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def s(metric: str, job: str, values: str, **labels: str) -> dict[str, str]:
    """One input series of job ``job`` as the driver's scrape labels it."""
    extra = "".join(f', {k}="{v}"' for k, v in labels.items())
    return {"series": f'{metric}{{namespace="{NS}", asyncrljob="{job}", {SCRAPE}{extra}}}', "values": values}


def op(metric: str, job: str, values: str, **labels: str) -> dict[str, str]:
    """One operator series (the operator sets namespace and asyncrljob itself)."""
    extra = "".join(f', {k}="{v}"' for k, v in labels.items())
    return {"series": f'{metric}{{job="asyncrl-operator", namespace="{NS}", asyncrljob="{job}"{extra}}}',
            "values": values}


def fires(alert: str, at: str, *jobs: str, severity: str, **labels: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": {"severity": severity, "namespace": NS, "asyncrljob": j, **labels}}
                           for j in jobs]}


def silent(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def thresholds(job: str, warn: float = 0.9, crit: float = 0.7, w: int = 2) -> list[dict[str, str]]:
    return [s("asyncrl_mask_guard_keep_ratio_threshold", job, f"{warn}x120", severity="warning"),
            s("asyncrl_mask_guard_keep_ratio_threshold", job, f"{crit}x120", severity="critical"),
            s("asyncrl_max_staleness_versions", job, f"{w}x120")]


def healthy(job: str) -> list[dict[str, str]]:
    """A job that trains well: 100 valid tokens/min, 98 kept, steady rollout, idle sync, Running."""
    return [
        *thresholds(job),
        s("up", job, "1x120"),
        s("asyncrl_policy_version", job, "0+1x120"),
        s("asyncrl_discrepancy_kept_tokens_total", job, "0+98x120", reference="ewma"),
        s("asyncrl_discrepancy_valid_tokens_total", job, "0+100x120", reference="ewma"),
        s("asyncrl_token_staleness_versions_sum", job, "0+80x120"),
        s("asyncrl_token_staleness_versions_count", job, "0+100x120"),
        s("asyncrl_weight_sync_duration_seconds_sum", job, "0+0.05x120"),
        s("asyncrl_weight_sync_duration_seconds_count", job, "0+1x120"),
        s("asyncrl_sync_phase_duration_seconds_sum", job, "0x120", phase="score"),
        s("asyncrl_sync_phase_duration_seconds_count", job, "0x120", phase="score"),
        s("asyncrl_sync_phase", job, "1x120", phase="idle"),
        s("asyncrl_sync_phase", job, "0x120", phase="score"),
        s("asyncrl_rollout_tokens_total", job, "0+1000x120", kind="sampled"),
        s("asyncrl_ewma_resets_total", job, "0x120", reason="keep_ratio_collapse"),
        s("asyncrl_nonfinite_losses_total", job, "0x120"),
        s("asyncrl_eval_success", job, "0.4+0.004x120"),  # held-out success rising
        op("asyncrl_operator_job_phase", job, "1x120", phase="Running"),
        op("asyncrl_operator_job_restarts_total", job, "0x120", cause="failure"),
    ]


OPERATOR_UP = {"series": 'asyncrl_operator_jobs{job="asyncrl-operator", namespace="ops", phase="Running"}',
               "values": "2x120"}

# name -> (input series, alert_rule_test cases). Jobs: "a" misbehaves, "b" is healthy, "c" a third shape.
CASES: dict[str, tuple[list[dict[str, str]], list[dict[str, Any]]]] = {
    "healthy": ([*healthy("a"), *healthy("b"), OPERATOR_UP], []),  # every alert silent: filled in below
    "mask": (
        [*thresholds("a"), *thresholds("b"), *thresholds("c"),
         s("asyncrl_discrepancy_kept_tokens_total", "a", "0+30x60", reference="ewma"),  # keep 0.3 < 0.7
         s("asyncrl_discrepancy_valid_tokens_total", "a", "0+100x60", reference="ewma"),
         s("asyncrl_discrepancy_kept_tokens_total", "b", "0+98x60", reference="ewma"),  # 0.98: healthy
         s("asyncrl_discrepancy_valid_tokens_total", "b", "0+100x60", reference="ewma"),
         s("asyncrl_discrepancy_kept_tokens_total", "c", "0+80x60", reference="ewma"),  # 0.8: warn > 0.8 >= crit
         s("asyncrl_discrepancy_valid_tokens_total", "c", "0+100x60", reference="ewma")],
        [silent("AsyncRLMaskCollapse", "3m"),  # below the threshold, but not yet for 5m
         fires("AsyncRLMaskCollapse", "20m", "a", severity="critical"),
         silent("AsyncRLMaskDegrading", "10m"),
         fires("AsyncRLMaskDegrading", "25m", "c", severity="warning")],
    ),
    "ewma": (
        [s("asyncrl_ewma_resets_total", "a", "0 0 0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", reason="keep_ratio_collapse"),
         s("asyncrl_ewma_resets_total", "b", "0 0 0 0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1", reason="manual"),
         s("asyncrl_ewma_resets_total", "c", "0x5 1+1x40", reason="keep_ratio_collapse"),  # one a minute from 6m
         s("asyncrl_ewma_resets_total", "d", "0+0x20 1+0x40", reason="keep_ratio_collapse"),  # one, at 21m
         # outcomes W versions later: c's resets every minute all fail to recover from 9m on; a recovered; e
         # resets every minute (a storm of resets) and every one recovers: no storm alert
         s("asyncrl_ewma_reset_outcomes_total", "a", "0x8 1x40", outcome="recovered"),
         s("asyncrl_ewma_reset_outcomes_total", "c", "0x8 1+1x40", outcome="unrecovered"),
         s("asyncrl_ewma_resets_total", "e", "0x5 1+1x40", reason="keep_ratio_collapse"),
         s("asyncrl_ewma_reset_outcomes_total", "e", "0x8 1+1x40", outcome="recovered"),
         s("asyncrl_ewma_reset_outcomes_total", "e", "0x48", outcome="unrecovered")],
        [silent("AsyncRLEwmaReset", "4m"),
         fires("AsyncRLEwmaReset", "7m", "a", "c", "e", severity="info", reason="keep_ratio_collapse"),
         fires("AsyncRLEwmaReset", "16m", "c", "e", severity="info", reason="keep_ratio_collapse"),  # a resolved
         silent("AsyncRLEwmaResetStorm", "9m"),  # c: one unrecovered so far
         fires("AsyncRLEwmaResetStorm", "30m", "c", severity="warning")],  # a, e: recovered; d: no outcome
    ),
    "eval": (
        [s("asyncrl_eval_success", "a", "0.4x10 0.9x20 0.5x40"),  # best 0.9, then 0.5 from 32m on
         s("asyncrl_eval_success", "b", "0.4x10 0.9x20 0.85x40"),  # 5 points below its best: noise
         s("asyncrl_eval_success", "c", "0.4x10 0.9x20 0.6x3 0.9x37")],  # 4 minutes low, then back
        [silent("AsyncRLEvalSuccessDrop", "34m"),  # a is low, but not yet for 5m
         fires("AsyncRLEvalSuccessDrop", "45m", "a", severity="warning")],
    ),
    "stalled": (
        [s("up", "a", "1x70"), s("asyncrl_policy_version", "a", "0+1x20 20x50"),  # up, no new version after 20m
         s("up", "b", "1x70"), s("asyncrl_policy_version", "b", "0+1x70"),
         s("up", "c", "0x70"), s("asyncrl_policy_version", "c", "7x70")],  # driver down: MetricsAbsent's case
        [silent("AsyncRLTrainingStalled", "40m"),  # no change for the 15m window since 35m, not yet for 10m
         fires("AsyncRLTrainingStalled", "50m", "a", severity="critical")],
    ),
    "nonfinite": (
        [s("asyncrl_nonfinite_losses_total", "a", "0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"),
         s("asyncrl_nonfinite_losses_total", "b", "0x40")],
        [silent("AsyncRLNonFiniteLoss", "2m"),
         fires("AsyncRLNonFiniteLoss", "5m", "a", severity="warning"),
         silent("AsyncRLNonFiniteLoss", "40m")],
    ),
    "staleness": (
        [*thresholds("a"), *thresholds("b"), *thresholds("c", w=0),
         s("asyncrl_token_staleness_versions_sum", "a", "0+190x60"),  # mean 1.9 >= 0.9 * 2
         s("asyncrl_token_staleness_versions_count", "a", "0+100x60"),
         s("asyncrl_token_staleness_versions_sum", "b", "0+50x60"),  # mean 0.5
         s("asyncrl_token_staleness_versions_count", "b", "0+100x60"),
         s("asyncrl_token_staleness_versions_sum", "c", "0x60"),  # W = 0: the synchronous baseline
         s("asyncrl_token_staleness_versions_count", "c", "0+100x60")],
        [silent("AsyncRLStalenessAtBound", "10m"), fires("AsyncRLStalenessAtBound", "30m", "a", severity="warning")],
    ),
    "sync": (
        [s("asyncrl_weight_sync_duration_seconds_sum", "a", "0+40x60"),  # 40 s per sync
         s("asyncrl_weight_sync_duration_seconds_count", "a", "0+1x60"),
         s("asyncrl_weight_sync_duration_seconds_sum", "b", "0+0.01x60"),
         s("asyncrl_weight_sync_duration_seconds_count", "b", "0+1x60"),
         s("asyncrl_sync_phase_duration_seconds_sum", "a", "0+90x60", phase="score"),  # 90 s per score phase
         s("asyncrl_sync_phase_duration_seconds_count", "a", "0+1x60", phase="score"),
         s("asyncrl_sync_phase_duration_seconds_sum", "b", "0+1x60", phase="interrupt"),
         s("asyncrl_sync_phase_duration_seconds_count", "b", "0+1x60", phase="interrupt"),
         s("asyncrl_sync_phase", "a", "1x60", phase="score"), s("asyncrl_sync_phase", "a", "0x60", phase="idle"),
         s("asyncrl_sync_phase", "b", "1 1 0 0 1 1 0 0 1 1 0 0 1 1 0 0 1 1 0 0", phase="score"),  # passes through
         s("asyncrl_sync_phase", "b", "0 0 1 1 0 0 1 1 0 0 1 1 0 0 1 1 0 0 1 1", phase="idle")],
        [silent("AsyncRLWeightSyncSlow", "5m"), fires("AsyncRLWeightSyncSlow", "20m", "a", severity="warning"),
         silent("AsyncRLSyncPhaseSlow", "2m"),
         fires("AsyncRLSyncPhaseSlow", "20m", "a", severity="warning", phase="score"),
         silent("AsyncRLSyncPhaseStuck", "3m"),
         fires("AsyncRLSyncPhaseStuck", "15m", "a", severity="critical", phase="score")],
    ),
    "throughput": (
        [s("asyncrl_rollout_tokens_total", "a", "0+1000x60 60000+100x40", kind="sampled"),  # drops at 60m
         s("asyncrl_rollout_tokens_total", "b", "0+1000x100", kind="sampled")],
        [silent("AsyncRLRolloutThroughputDrop", "55m"),
         fires("AsyncRLRolloutThroughputDrop", "85m", "a", severity="warning")],
    ),
    "env_errors": (
        [s("asyncrl_env_errors_total", "a", "0+10x40", reason="timeout"),  # 10 of 100 per minute: 10% > 5%
         s("asyncrl_trajectories_total", "a", "0+90x40", status="finished"),
         s("asyncrl_trajectories_total", "a", "0+10x40", status="aborted"),
         s("asyncrl_env_errors_total", "b", "0+1x40", reason="exception"),  # 1%: below the threshold
         s("asyncrl_trajectories_total", "b", "0+100x40", status="finished"),
         s("asyncrl_env_errors_total", "c", "0x5 0+20x3 60x32", reason="bad_messages"),  # a 3-minute burst
         s("asyncrl_trajectories_total", "c", "0+100x40", status="finished")],
        # a: above the threshold, not yet for 10m at 8m, firing at 25m; b never; c's burst ended long before 25m
        [silent("AsyncRLEnvErrors", "8m"), fires("AsyncRLEnvErrors", "25m", "a", severity="warning")],
    ),
    "lifecycle": (
        [op("asyncrl_operator_job_phase", "a", "1x60", phase="Failed"),
         op("asyncrl_operator_job_phase", "b", "1x60", phase="Running"), s("up", "b", "1x60"),
         op("asyncrl_operator_job_phase", "c", "1x60", phase="Pending"),
         op("asyncrl_operator_job_phase", "d", "1x4", phase="Pending"),  # Pending 5m, then Running
         op("asyncrl_operator_job_phase", "d", "_x5 1x55", phase="Running"), s("up", "d", "_x5 1x55"),
         op("asyncrl_operator_job_phase", "e", "1x60", phase="Running"),  # Running, never scraped
         op("asyncrl_operator_job_restarts_total", "a", "0 0 1 1 2 2 2 2 2 2 2 2 2 2 2 2", cause="failure"),
         op("asyncrl_operator_job_restarts_total", "b", "0 1 2 3 4 4 4 4 4 4 4 4 4 4 4 4", cause="spec_change"),
         op("asyncrl_operator_job_restarts_total", "c", "0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1", cause="preemption"),
         OPERATOR_UP],
        [fires("AsyncRLJobFailed", "1m", "a", severity="critical", phase="Failed"),
         silent("AsyncRLJobStuckBeforeRunning", "10m"),
         fires("AsyncRLJobStuckBeforeRunning", "20m", "c", severity="warning", phase="Pending"),
         silent("AsyncRLJobRestarting", "2m"),
         fires("AsyncRLJobRestarting", "10m", "a", severity="warning"),
         silent("AsyncRLMetricsAbsent", "5m"),
         fires("AsyncRLMetricsAbsent", "20m", "e", severity="warning"),
         silent("AsyncRLOperatorDown", "20m")],
    ),
    "operator_down": (
        [s("up", "a", "1x30"), s("up", "b", "1x30"), s("up", "c", "0x30")],  # no asyncrl_operator_* at all
        [silent("AsyncRLOperatorDown", "3m"),
         fires("AsyncRLOperatorDown", "10m", "a", "b", severity="critical")],
    ),
}


def unit_tests(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """promtool's test file: one test group per case, the healthy one asserting every alert silent."""
    names = sorted(alerts(groups))
    tests = []
    for name, (series, cases) in CASES.items():
        if name == "healthy":
            cases = [silent(a, at) for a in names for at in ("30m", "90m")]
        tests.append({"name": name, "interval": "1m", "input_series": series, "alert_rule_test": cases})
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}


def without_annotations(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]} for g in groups]


def run_promtool(groups: list[dict[str, Any]], tests: dict[str, Any], tmp: Path) -> subprocess.CompletedProcess[str]:
    (tmp / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    (tmp / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    return subprocess.run([promtool(), "test", "rules", str(tmp / "tests.yaml")], capture_output=True, text=True,
                          timeout=120, cwd=tmp)


def test_rendered_rules_pass_promtool_check(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rendered_groups()}))
    out = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_fires_where_it_should_and_nowhere_else(tmp_path: Path) -> None:
    groups = rendered_groups()
    names = set(alerts(groups))
    tests = unit_tests(groups)
    cases = [(t["name"], c) for t in tests["tests"] for c in t["alert_rule_test"]]
    for name in names:  # a firing case, and a silent one besides the healthy group's
        assert any(c["alertname"] == name and c["exp_alerts"] for _, c in cases), f"{name}: no firing case"
        assert any(c["alertname"] == name and not c["exp_alerts"] for _, c in cases), f"{name}: no silent case"
        assert any(c["alertname"] == name and not c["exp_alerts"] for g, c in cases if g != "healthy") or \
            name == "AsyncRLJobFailed", f"{name}: silent only on healthy series"
    out = run_promtool(without_annotations(groups), tests, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_unit_tests_can_fail(tmp_path: Path) -> None:
    # The same tests against rules whose collapse threshold is the warning one: job c (keep 0.8) fires too.
    groups = rendered_groups()
    for g in groups:
        for r in g["rules"]:
            if r.get("alert") == "AsyncRLMaskCollapse":
                r["expr"] = r["expr"].replace('severity="critical"', 'severity="warning"')
    out = run_promtool(without_annotations(groups), unit_tests(groups), tmp_path)
    assert out.returncode != 0 and "AsyncRLMaskCollapse" in out.stdout + out.stderr


def test_alerts_carry_identity_severity_and_a_runbook() -> None:
    fixed = {"AsyncRLMaskCollapse", "AsyncRLMaskDegrading", "AsyncRLEwmaReset", "AsyncRLEwmaResetStorm",
             "AsyncRLTrainingStalled"}
    found = alerts(rendered_groups("prometheusRule.runbookUrl=https://example.org/asyncrl/docs/runbooks/"))
    assert fixed <= found.keys() and len(found) >= 15
    for name, rule in found.items():
        assert rule["for"] and rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert {"summary", "description", "runbook_url"} <= rule["annotations"].keys(), name
        assert rule["annotations"]["runbook_url"] == f"https://example.org/asyncrl/docs/runbooks/{name}.md"
        runbook = ROOT / "docs" / "runbooks" / f"{name}.md"
        assert runbook.exists(), f"{name}: write {runbook.relative_to(ROOT)}"
        text = runbook.read_text()
        for section in ("## What it means", "## Confirm", "## What to do", "## The mask guard"):
            assert section in text, f"{runbook.relative_to(ROOT)}: missing {section!r}"
        if name != "AsyncRLOperatorDown":  # the one alert that fires with no job known
            # aggregated by job identity, directly or through a recording rule (which is)
            assert "by (namespace, asyncrljob" in rule["expr"] or "asyncrl:" in rule["expr"], name
    records = [r["record"] for g in rendered_groups() for r in g["rules"] if "record" in r]
    assert "asyncrl:keep_ratio:rate5m" in records and all(r.startswith("asyncrl:") for r in records)


def test_values_switch_alerts_and_set_thresholds_and_for() -> None:
    found = alerts(rendered_groups("prometheusRule.alerts.AsyncRLOperatorDown.enabled=false",
                                   "prometheusRule.alerts.AsyncRLWeightSyncSlow.seconds=12",
                                   "prometheusRule.alerts.AsyncRLMaskCollapse.for=30s",
                                   "prometheusRule.alerts.AsyncRLEwmaReset.severity=warning"))
    assert "AsyncRLOperatorDown" not in found
    assert found["AsyncRLWeightSyncSlow"]["expr"].strip().endswith("> 12")
    assert found["AsyncRLMaskCollapse"]["for"] == "30s"
    assert found["AsyncRLEwmaReset"]["labels"]["severity"] == "warning"
    assert "{{ .alert" not in yaml.safe_dump(found)


def test_bad_alert_values_are_refused_by_the_schema() -> None:
    helm = find_helm()
    if helm is None:
        pytest.fail("helm v3 not found; run `make tools`", pytrace=False)
    for bad in ("prometheusRule.alerts.AsyncRLMaskCollapse.for=5 minutes",
                "prometheusRule.alerts.AsyncRLJobRestarting.restarts=0",
                "prometheusRule.alerts.AsyncRLNoSuchAlert.enabled=true"):
        out = subprocess.run([helm, "template", "rel", str(CHART), "--set", bad], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode != 0 and "schema" in out.stderr.lower(), (bad, out.stderr)
