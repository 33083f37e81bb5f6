"""Operator metrics (deleted jobs leave no series), settings from the environment, status helpers."""

import pytest
from prometheus_client import CollectorRegistry

from asyncrl.api.status import ReportThrottle, TrainingSummary, training_patch
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.metrics import create_metrics


def test_job_series_disappear_when_the_job_is_deleted() -> None:
    reg = CollectorRegistry()
    m = create_metrics(reg)
    m.observe_phase("ns", "a", "Running")
    m.observe_phase("ns", "b", "Running")
    for cause in ("failure", "preemption", "spec_change"):  # a new job's counters start at 0
        assert reg.get_sample_value("asyncrl_operator_job_restarts_total",
                                    {"namespace": "ns", "asyncrljob": "b", "cause": cause}) == 0
    m.restarted("ns", "a", "failure")
    assert reg.get_sample_value("asyncrl_operator_jobs", {"phase": "Running"}) == 2
    m.observe_phase("ns", "a", "Failed")
    assert reg.get_sample_value("asyncrl_operator_job_phase", {"namespace": "ns", "asyncrljob": "a",
                                                               "phase": "Running"}) is None
    m.forget("ns", "a")
    assert reg.get_sample_value("asyncrl_operator_jobs", {"phase": "Failed"}) == 0
    assert reg.get_sample_value("asyncrl_operator_job_restarts_total",
                                {"namespace": "ns", "asyncrljob": "a", "cause": "failure"}) is None
    assert reg.get_sample_value("asyncrl_operator_reconcile_errors_total", {"kind": "api"}) == 0  # pre-set


def test_settings_from_env_name_the_bad_variable() -> None:
    cfg = OperatorSettings.from_env({"ASYNCRL_OPERATOR_RESYNC_SECONDS": "5", "ASYNCRL_OPERATOR_JOB_IMAGE": "x:1"})
    assert cfg.resync_seconds == 5.0 and cfg.job_image == "x:1"
    with pytest.raises(ValueError, match="ASYNCRL_OPERATOR_METRICS_PORT='http'"):
        OperatorSettings.from_env({"ASYNCRL_OPERATOR_METRICS_PORT": "http"})
    # backoff doubles per counted restart: 10, 20, 40 ... capped at 300
    assert [OperatorSettings().restart_delay(n) for n in (1, 2, 3, 7)] == [10, 20, 40, 300]


def test_prometheus_selectors_are_json_label_maps() -> None:
    default = OperatorSettings.from_env({})
    assert default.prometheus_namespace_selector is None  # the job's own namespace only
    assert OperatorSettings.from_env({"ASYNCRL_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR": "{}"}
                                     ).prometheus_namespace_selector == {}  # an admin's explicit "any namespace"
    assert default.prometheus_pod_selector == {"app.kubernetes.io/name": "prometheus"}  # kube-prometheus-stack
    cfg = OperatorSettings.from_env({
        "ASYNCRL_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR": '{"kubernetes.io/metadata.name": "monitoring"}',
        "ASYNCRL_OPERATOR_PROMETHEUS_POD_SELECTOR": '{"prometheus": "kps"}'})
    assert cfg.prometheus_namespace_selector == {"kubernetes.io/metadata.name": "monitoring"}
    assert cfg.prometheus_pod_selector == {"prometheus": "kps"}
    with pytest.raises(ValueError) as err:  # every problem at once, each with its variable
        OperatorSettings.from_env({"ASYNCRL_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR": "monitoring",
                                   "ASYNCRL_OPERATOR_PROMETHEUS_POD_SELECTOR": '{"replicas": 2}'})
    msg = str(err.value)
    assert "ASYNCRL_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR='monitoring' is not JSON" in msg
    assert "ASYNCRL_OPERATOR_PROMETHEUS_POD_SELECTOR=" in msg and "string labels" in msg


def test_privileged_namespaces_are_a_json_list_of_names() -> None:
    assert OperatorSettings.from_env({}).privileged_namespaces == ()  # nobody may ask for privileged pods
    cfg = OperatorSettings.from_env({"ASYNCRL_OPERATOR_PRIVILEGED_NAMESPACES": '["ml-debug", "gpu-lab"]'})
    assert cfg.privileged_namespaces == ("ml-debug", "gpu-lab")
    for raw in ("ml-debug", '{"ml-debug": true}', '[""]', "[1]"):
        with pytest.raises(ValueError, match="ASYNCRL_OPERATOR_PRIVILEGED_NAMESPACES=.* must be a JSON list of "
                                             "namespace names"):
            OperatorSettings.from_env({"ASYNCRL_OPERATOR_PRIVILEGED_NAMESPACES": raw})


def test_training_patch_and_throttle() -> None:
    s = TrainingSummary(policy_version=7, keep_ratio=0.8123, staleness_max=2)
    assert training_patch(s) == {"status": {"training": {"policyVersion": 7, "keepRatio": 0.8123,
                                                         "keepPercent": 81.2, "ewmaResets": 0, "envErrors": 0,
                                                         "stalenessMax": 2}}}
    t = ReportThrottle()
    assert t.ready(0.0)
    t.sent(0.0)
    assert not t.ready(29.9) and t.ready(30.0)
    with pytest.raises(ValueError, match="Prometheus"):
        ReportThrottle(5)
