"""The driver's metric catalogue: naming rules, pre-set labels, generated docs, HTTP exporter."""

import re
import urllib.request
from dataclasses import fields
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from asyncrl.api.job import AsyncRLJob
from asyncrl.trainer.correction.stats import CorrectionStats
from asyncrl.trainer.driver.loop.accounting import (
    count_correction,
    count_ewma_reset,
    set_job_gauges,
    set_sync_phase,
)
from asyncrl.trainer.driver.run.metrics import (
    CATALOGUE,
    SYNC_STATES,
    create_metrics,
    metrics_markdown,
    serve_metrics,
)

ROOT = Path(__file__).resolve().parents[2]


def test_docs_are_generated_from_the_catalogue():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert doc == metrics_markdown(), "docs/metrics.md drifted: python -m asyncrl.trainer.driver.run.metrics docs/metrics.md"


def test_names_follow_the_prometheus_conventions():
    seen = set()
    for d in CATALOGUE:
        assert d.name.startswith("asyncrl_"), d.name
        assert re.fullmatch(r"[a-z][a-z0-9_]*", d.name), d.name  # lower snake case (kl_k3 has a digit)
        assert d.name not in seen
        seen.add(d.name)
        if d.kind == "counter":
            assert d.name.endswith("_total"), d.name
        else:
            assert not d.name.endswith("_total"), d.name
        if "seconds" in d.name or "duration" in d.name:
            assert d.name.endswith(("_seconds", "_seconds_total")), d.name
        assert "millis" not in d.name and "_ms" not in d.name
        for _, values in d.labels:
            assert 0 < len(values) <= 16  # bounded


def test_every_label_value_is_preset_to_zero():
    registry = CollectorRegistry()
    create_metrics(registry)
    v = registry.get_sample_value
    assert v("asyncrl_ewma_resets_total", {"reason": "keep_ratio_collapse"}) == 0.0
    assert v("asyncrl_dropped_trajectories_total", {"reason": "stale"}) == 0.0
    assert v("asyncrl_staleness_clipped_tokens_total", {"reference": "ewma", "side": "dual"}) == 0.0
    assert v("asyncrl_trajectories_total", {"status": "aborted"}) == 0.0


def test_exporter_serves_the_catalogue_on_loopback():
    registry = CollectorRegistry()
    m = create_metrics(registry)
    m.job.info({"name": "t", "reference": "ewma"})
    m.policy_version.set(3)
    m.trajectories.labels("finished").inc(5)
    server = serve_metrics(registry, port=0)
    try:
        assert server.host == "127.0.0.1" and server.port > 0
        body = urllib.request.urlopen(server.url, timeout=5).read().decode()
    finally:
        server.close()
    samples = {s.name for f in text_string_to_metric_families(body) for s in f.samples}
    for d in CATALOGUE:
        assert (d.name + "_bucket" if d.kind == "histogram" else d.name) in samples, d.name
    assert "asyncrl_policy_version 3.0" in body
    assert 'asyncrl_trajectories_total{status="finished"} 5.0' in body


def test_correction_counts_reach_the_counters_as_counted():
    # 7 of 9 valid tokens kept, clipped low 1, high 2, dual 0; ESS = 6^2 / (9 * 5) = 0.8.
    registry = CollectorRegistry()
    m = create_metrics(registry)
    zeros = {f.name: 0.0 for f in fields(CorrectionStats)}
    stats = CorrectionStats(**zeros | {"valid_tokens": 9.0, "kept_tokens": 7.0, "clip_low_tokens": 1.0,
                                       "clip_high_tokens": 2.0, "nonfinite_tokens": 3.0, "weight_sum": 6.0,
                                       "weight_sq_sum": 5.0, "kl_k3_theta_ref_sum": 0.18})
    for _ in range(2):  # two steps: counts add up exactly (no fraction multiplied back and rounded)
        count_correction(m, CorrectionStats.from_record(stats.record()), "ewma", trained_tokens=12)
    v = registry.get_sample_value
    assert v("asyncrl_discrepancy_kept_tokens_total", {"reference": "ewma"}) == 14.0
    assert v("asyncrl_discrepancy_valid_tokens_total", {"reference": "ewma"}) == 18.0
    assert v("asyncrl_staleness_clipped_tokens_total", {"reference": "ewma", "side": "high"}) == 4.0
    assert v("asyncrl_staleness_clipped_tokens_total", {"reference": "ewma", "side": "dual"}) == 0.0
    assert v("asyncrl_nonfinite_tokens_total") == 6.0 and v("asyncrl_trained_tokens_total") == 24.0
    assert v("asyncrl_importance_ess_ratio") == pytest.approx(0.8)
    assert v("asyncrl_kl_k3") == pytest.approx(0.02)  # 0.18 / 9
    count_ewma_reset(m, "")
    count_ewma_reset(m, "keep_ratio_collapse")
    assert v("asyncrl_ewma_resets_total", {"reason": "keep_ratio_collapse"}) == 1.0


def test_job_gauges_carry_the_thresholds_and_the_idle_phase():
    job = AsyncRLJob.model_validate({
        "apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "g"},
        "spec": {"async": {"maxStaleness": 3},
                 "monitoring": {"maskGuard": {"warnKeepRatio": 0.85, "criticalKeepRatio": 0.6}}},
    })
    registry = CollectorRegistry()
    m = create_metrics(registry)
    set_job_gauges(m, job.spec)
    v = registry.get_sample_value
    assert v("asyncrl_mask_guard_keep_ratio_threshold", {"severity": "warning"}) == 0.85
    assert v("asyncrl_mask_guard_keep_ratio_threshold", {"severity": "critical"}) == 0.6
    assert v("asyncrl_max_staleness_versions") == 3.0
    assert [v("asyncrl_sync_phase", {"phase": p}) for p in SYNC_STATES] == [1.0, 0.0, 0.0, 0.0, 0.0]
    set_sync_phase(m, "score")
    assert [v("asyncrl_sync_phase", {"phase": p}) for p in SYNC_STATES] == [0.0, 0.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="valid: idle, interrupt, score, update, resume"):
        set_sync_phase(m, "Pausing")
    assert v("asyncrl_sync_phase_duration_seconds_count", {"phase": "interrupt"}) == 0.0  # pre-set, empty
