"""The generated Grafana dashboard: no drift, every query parses (promtool), names real metrics and labels.

The metric check reads the driver's CATALOGUE and the operator's metrics through real registries,
so renaming a metric or a label there fails here until the dashboard follows.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from asyncrl.operator.metrics import create_metrics as create_operator_metrics
from asyncrl.trainer.driver.run.metrics import create_metrics as create_driver_metrics
from monitoring import dashboard

ROOT = Path(__file__).resolve().parents[2]

# Labels Prometheus adds at scrape time (PodMonitor relabelling); `le` comes with the bucket series.
TARGET_LABELS = {"namespace", "asyncrljob", "role"}


def _exposed_series() -> dict[str, set[str]]:
    """Every series name the driver and the operator expose, with its label names."""
    driver, operator = CollectorRegistry(), CollectorRegistry()
    create_driver_metrics(driver)
    op = create_operator_metrics(operator)
    # Per-job operator series exist only once a job is seen: make them exist the way the operator does.
    op.observe_phase("ns", "job", "Running")
    op.restarted("ns", "job", "failure")
    series: dict[str, set[str]] = {}
    for registry in (driver, operator):
        for family in registry.collect():
            for sample in family.samples:
                series.setdefault(sample.name, set()).update(sample.labels)
    return series


def _all_queries() -> list[tuple[str, str]]:
    """Every PromQL expression the dashboard holds, raw (with Grafana variables)."""
    out = [(p.title, q.expr) for _, panels in dashboard.ROWS for p in panels for q in p.queries]
    out.append(("annotation: EWMA resets", dashboard.EWMA_RESET_ANNOTATION.expr))
    # The template variables' label_values(<selector>, <label>): their selector is PromQL too.
    for name, q in (("namespace", dashboard.NAMESPACE_VALUES), ("job", dashboard.JOB_VALUES)):
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", q)
        assert m, f"variable {name}: {q!r} is not label_values(<selector>, <label>)"
        out.append((f"variable {name}", f"count by ({m.group(2)}) ({m.group(1)})"))
    return out


def test_checked_in_json_equals_generator() -> None:
    checked_in = dashboard.OUTPUT.read_text()
    assert checked_in == dashboard.render_json(), (
        f"{dashboard.OUTPUT.relative_to(ROOT)} has drifted from monitoring/dashboard.py; "
        f"regenerate it with: {dashboard.REGENERATE}"
    )


def test_check_flag_reports_drift_with_the_regenerate_command(tmp_path: Path) -> None:
    out = tmp_path / "asyncrl.json"
    out.write_text(dashboard.render_json().replace("asyncrl: jobs", "hand-edited"))
    proc = subprocess.run([sys.executable, str(ROOT / "monitoring" / "dashboard.py"), "--check", "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert dashboard.REGENERATE in proc.stderr
    subprocess.run([sys.executable, str(ROOT / "monitoring" / "dashboard.py"), "--output", str(out)],
                   check=True, timeout=120)
    assert out.read_text() == dashboard.render_json()


def test_rows_and_variables_as_the_issue_lists_them() -> None:
    data = json.loads(dashboard.render_json())
    rows = [p["title"] for p in data["panels"] if p["type"] == "row"]
    assert rows == ["Overview", "Algorithm health", "Async pipeline", "Throughput", "Environments and agents",
                    "Synchronisation", "Old-logit cost", "Operator"]
    variables = {v["name"]: v["type"] for v in data["templating"]["list"]}
    assert variables == {"datasource": "datasource", "namespace": "query", "job": "query"}
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    for p in data["panels"]:
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"], f"panel {p['title']!r} has no query"
        # Grafana's grid is 24 columns wide.
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]


def test_every_job_query_filters_namespace_and_job() -> None:
    operator_wide = {"asyncrl_operator_reconcile_duration_seconds_bucket", "asyncrl_operator_reconcile_errors_total"}
    for title, expr in _all_queries():
        if title.startswith("variable"):
            continue
        for m in re.finditer(r"(asyncrl_[a-z0-9_]+)(\{[^}]*\})?", expr):
            if m.group(1) in operator_wide:
                assert not m.group(2), f"{title}: {m.group(1)} is operator-wide, it has no job labels"
                continue
            assert m.group(2) and dashboard.JOB in m.group(2), (
                f"{title}: {m.group(0)!r} lacks the filter {{{dashboard.JOB}}}"
            )


def test_every_metric_and_label_a_query_names_is_exported() -> None:
    series = _exposed_series()
    known = series
    problems = []
    for title, expr in _all_queries():
        names = set(re.findall(r"\b(asyncrl_[a-z0-9_]+)\b", expr))
        for name in sorted(names - known.keys()):
            problems.append(f"{title}: metric {name} is neither in the driver's CATALOGUE nor the operator's metrics")
        allowed = TARGET_LABELS.union(*(known.get(n, set()) for n in names))
        used = set(re.findall(r"\b([a-z_]+)\s*(?:=~|!=|!~|=)\s*\"", expr))
        for group in re.findall(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", expr):
            used.update(label.strip() for label in group.split(",") if label.strip())
        if title.startswith("variable"):
            used.discard(expr.split("(")[1].split(")")[0].strip())  # count by (<label>): the listed label
            used.update(re.findall(r", (\w+)\)$", dashboard.NAMESPACE_VALUES if "namespace" in title
                                   else dashboard.JOB_VALUES))
        for label in sorted(used - allowed):
            problems.append(f"{title}: label {label!r} is not on {sorted(names)}; labels there: {sorted(allowed)}")
    assert not problems, "\n".join(problems)


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: `make tools` installs it (Debian package prometheus)", pytrace=False)
    queries = _all_queries()
    rules = {"groups": [{"name": "dashboard-queries", "rules": [
        {"record": f"asyncrl_dashboard:query_{i}:test", "expr": dashboard.substitute(expr)}
        for i, (_, expr) in enumerate(queries)
    ]}]}
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"promtool check rules failed:\n{proc.stdout}\n{proc.stderr}"
    assert f"SUCCESS: {len(queries)} rules found" in proc.stdout, proc.stdout


def test_promtool_refuses_a_broken_query(tmp_path: Path) -> None:
    # The check above can fail: a query with an unbalanced parenthesis is refused by the same call.
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: `make tools` installs it (Debian package prometheus)"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "a:b:c", "expr": "sum(rate(asyncrl_trained_tokens_total[1m])"}]}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0


def test_panel_queries_substitute_every_variable() -> None:
    queries = dashboard.panel_queries(namespace="ns-a", job="job-1|job-2", rate_interval="30s")
    panels = [p for _, ps in dashboard.ROWS for p in ps]
    assert len(queries) == sum(len(p.queries) for p in panels)
    assert [t for t, _ in queries][:2] == ["Phase", "Policy version"]
    for title, expr in queries:
        assert "$" not in expr, f"{title}: unsubstituted variable in {expr!r}"
        if "operator_reconcile" not in expr:
            assert 'namespace=~"ns-a", asyncrljob=~"job-1|job-2"' in expr, f"{title}: {expr!r}"
    # The keep-ratio panel: kept over valid per job, plus the job's two threshold lines.
    keep = [e for t, e in queries if t == "Keep ratio (mask guard)"]
    assert len(keep) == 3
    assert "rate(asyncrl_discrepancy_kept_tokens_total" in keep[0] and "[30s]" in keep[0]
    assert 'severity="warning"' in keep[1] and 'severity="critical"' in keep[2]
    assert dashboard.annotation_queries(job="j")[0][1].endswith("> 0")
