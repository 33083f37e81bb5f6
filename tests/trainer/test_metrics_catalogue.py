"""The driver's metric catalogue: naming rules, pre-set labels, generated docs, HTTP exporter."""

import re
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from asyncrl.trainer.driver.metrics import CATALOGUE, create_metrics, metrics_markdown, serve_metrics

ROOT = Path(__file__).resolve().parents[2]


def test_docs_are_generated_from_the_catalogue():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert doc == metrics_markdown(), "docs/metrics.md drifted: python -m asyncrl.trainer.driver.metrics docs/metrics.md"


def test_names_follow_the_prometheus_conventions():
    seen = set()
    for d in CATALOGUE:
        assert d.name.startswith("asyncrl_"), d.name
        assert re.fullmatch(r"[a-z_]+", d.name), d.name
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
