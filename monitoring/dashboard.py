"""The asyncrl Grafana dashboard, generated with Grafana's foundation SDK (never hand-written JSON).

The panels are one table (``ROWS``): :func:`build_dashboard` turns it into the dashboard through
the SDK's builders, :func:`panel_queries` lists the same queries with the template variables
substituted (the end-to-end test runs them against a real Prometheus), so the two cannot drift.

Every job query filters ``namespace=~"$namespace", asyncrljob=~"$job"``: both labels come from
scrape relabelling (``charts/asyncrl/templates/podmonitor.yaml``), the driver never sets them.
The operator's per-job series (``asyncrl_operator_job_phase``, ``..._job_restarts_total``) carry
the same two labels as metric labels; its reconcile latency and errors are operator-wide and
carry neither, so those panels are not filtered by job.

Usage (from the repository root)::

    python monitoring/dashboard.py           # (re)write charts/asyncrl/files/dashboards/asyncrl.json
    python monitoring/dashboard.py --check   # exit 1 when the checked-in JSON differs from the generator
"""

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, stat, timeseries
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dbm
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "charts" / "asyncrl" / "files" / "dashboards" / "asyncrl.json"
REGENERATE = "python monitoring/dashboard.py"
UID = "asyncrl-jobs"

# The job filter every driver query carries; `by (namespace, asyncrljob)` keeps one series per job.
JOB = 'namespace=~"$namespace", asyncrljob=~"$job"'
BY_JOB = "namespace, asyncrljob"
RATE = "$__rate_interval"
DATASOURCE = dbm.DataSourceRef(type_val="prometheus", uid="${datasource}")

PanelKind = Literal["timeseries", "stat", "heatmap", "phase"]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelDef:
    """One panel: what it shows (kind, unit), its queries, and a description for the SRE."""

    title: str
    kind: PanelKind
    queries: tuple[Query, ...]
    description: str
    unit: str = "short"
    width: int = 8
    # Series (by legend regexp) drawn as dashed threshold lines in a fixed colour.
    threshold_lines: tuple[tuple[str, str], ...] = field(default=())
    min_value: float | None = None


def _ratio(num: str, den: str, by: str = BY_JOB) -> str:
    """``rate(num) / rate(den)`` per job, over Grafana's rate interval (ratios are exported as counters)."""
    return (
        f"sum by ({by}) (rate({num}{{{JOB}}}[{RATE}]))\n"
        f"/ on ({BY_JOB}) group_left\nsum by ({BY_JOB}) (rate({den}{{{JOB}}}[{RATE}]))"
    )


def _quantile(q: float, histogram: str, by: str = BY_JOB) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({histogram}_bucket{{{JOB}}}[{RATE}])))"


def _per_job(expr: str) -> str:
    return f"max by ({BY_JOB}) ({expr}{{{JOB}}})"


J = "{{asyncrljob}}"  # legend prefix: one series per job

ROWS: tuple[tuple[str, tuple[PanelDef, ...]], ...] = (
    ("Overview", (
        PanelDef("Phase", "phase", (Query(
            f'asyncrl_operator_job_phase{{{JOB}}} == 1', f"{J}: {{{{phase}}}}"),),
            "Current phase of each AsyncRLJob, as the operator sees it (needs the operator scraped).", width=6),
        PanelDef("Policy version", "stat", (Query(_per_job("asyncrl_policy_version"), J),),
                 "Version of the actor's weights (optimizer steps taken, including resumed ones).", width=6),
        PanelDef("Restarts", "stat", (Query(
            f"sum by ({BY_JOB}, cause) (asyncrl_operator_job_restarts_total{{{JOB}}})", f"{J} {{{{cause}}}}"),),
            "Gang restarts by cause (failure, preemption, spec_change), from the operator.", width=6),
        PanelDef("Steps / hour", "timeseries", (Query(
            f"3600 * sum by ({BY_JOB}) (rate(asyncrl_optimizer_steps_total{{{JOB}}}[{RATE}]))", J),),
            "Optimizer steps per hour.", width=6, min_value=0),
    )),
    ("Algorithm health", (
        PanelDef("Keep ratio (mask guard)", "timeseries", (
            Query(_ratio("asyncrl_discrepancy_kept_tokens_total", "asyncrl_discrepancy_valid_tokens_total"),
                  f"{J} keep ratio"),
            Query(f'max by ({BY_JOB}) (asyncrl_mask_guard_keep_ratio_threshold{{{JOB}, severity="warning"}})',
                  f"{J} warning threshold"),
            Query(f'max by ({BY_JOB}) (asyncrl_mask_guard_keep_ratio_threshold{{{JOB}, severity="critical"}})',
                  f"{J} critical threshold"),
        ), "Share of valid tokens the train-inference discrepancy mask keeps, with the job's "
           "spec.monitoring.maskGuard warning and critical lines (AsyncRLMaskDegrading / AsyncRLMaskCollapse).",
            unit="percentunit", width=12, threshold_lines=((".*warning threshold", "orange"),
                                                           (".*critical threshold", "red")), min_value=0),
        PanelDef("Clip fractions", "timeseries", (Query(
            _ratio("asyncrl_staleness_clipped_tokens_total", "asyncrl_discrepancy_valid_tokens_total",
                   by=f"{BY_JOB}, side"), f"{J} {{{{side}}}}"),),
            "Share of valid tokens whose gradient the sign-aware PPO clip stops, by side (low, high, dual).",
            unit="percentunit", width=12, min_value=0),
        PanelDef("Importance ESS ratio", "timeseries", (Query(_per_job("asyncrl_importance_ess_ratio"), J),),
                 "Effective sample size of the importance weights / valid tokens, last step (1 = on-policy).",
                 unit="percentunit", min_value=0),
        PanelDef("KL k3 (pi_theta || pi_ref)", "timeseries", (Query(_per_job("asyncrl_kl_k3"), J),),
                 "k3 estimate of the KL between the current policy and the reference, over valid tokens."),
        PanelDef("EWMA resets", "timeseries", (Query(
            f"sum by ({BY_JOB}, reason) (asyncrl_ewma_resets_total{{{JOB}}})", f"{J} {{{{reason}}}}"),),
            "Resets of the PPO-EWMA reference to the current weights, by reason; each reset is also an "
            "annotation on every panel.", min_value=0),
        PanelDef("MoE route-flip share (routing replay)", "timeseries", (Query(
            _ratio("asyncrl_route_flip_tokens_total", "asyncrl_route_replayed_tokens_total"), J),),
            "Share of trained tokens whose replayed MoE routes (correction.routingReplay) the training forward's "
            "own router would have changed in at least one layer: the routing part of the train-inference "
            "mismatch that replay removes. Empty without replay.", unit="percentunit", min_value=0),
        PanelDef("Held-out evaluation (current version)", "timeseries", (
            Query(_per_job("asyncrl_eval_success"), f"{J} eval success"),
            Query(_per_job("asyncrl_eval_reward"), f"{J} eval reward"),
        ), "Success and mean reward of the last evaluated policy version on the task's fixed held-out prompts "
           "(spec.eval; never trained on): the learning curve at equal versions. asyncrl_eval_version says which "
           "version; flat until the next evaluation.", unit="percentunit", width=16, min_value=0),
    )),
    ("Async pipeline", (
        PanelDef("Token staleness (versions)", "heatmap", (Query(
            f"sum by (le) (rate(asyncrl_token_staleness_versions_bucket{{{JOB}}}[{RATE}]))", "{{le}}"),),
            "Version gap of trained tokens when they reach the actor (histogram).", width=12),
        PanelDef("Staleness p95 and bound W", "timeseries", (
            Query(_quantile(0.95, "asyncrl_token_staleness_versions"), f"{J} p95"),
            Query(_per_job("asyncrl_max_staleness_versions"), f"{J} W (maxStaleness)"),
        ), "95th percentile of the token version gap against the job's async.maxStaleness.", width=12,
            threshold_lines=((".*W \\(maxStaleness\\)", "red"),), min_value=0),
        PanelDef("Buffer depth", "timeseries", (
            Query(_per_job("asyncrl_buffer_ready_groups"), f"{J} ready"),
            Query(_per_job("asyncrl_rollout_running_groups"), f"{J} running"),
        ), "GRPO groups waiting in the staleness buffer and still being generated.", min_value=0),
        PanelDef("Admission capacity", "timeseries", (Query(_per_job("asyncrl_admission_capacity_groups"), J),),
                 "Groups rollout may still start at the current version (0 = rollout blocked by staleness).",
                 min_value=0),
        PanelDef("Idle ratios", "timeseries", (
            Query(_ratio("asyncrl_rollout_idle_seconds_total", "asyncrl_rollout_worker_seconds_total"),
                  f"{J} rollout idle"),
            Query(_ratio("asyncrl_trainer_idle_seconds_total", "asyncrl_trainer_seconds_total"),
                  f"{J} trainer idle"),
        ), "Share of time rollout workers had no generate call, and the actor waited for a batch.",
            unit="percentunit", min_value=0),
        PanelDef("Partial trajectories", "timeseries", (Query(
            _ratio("asyncrl_partial_trajectories_total", "asyncrl_trajectories_total"), J),),
            "Share of returned trajectories whose tokens span more than one policy version.",
            unit="percentunit", width=12, min_value=0),
        PanelDef("Dropped trajectories / s", "timeseries", (Query(
            f"sum by ({BY_JOB}, reason) (rate(asyncrl_dropped_trajectories_total{{{JOB}}}[{RATE}]))",
            f"{J} {{{{reason}}}}"),),
            "Trajectories dropped before training (stale: version gap above maxStaleness).",
            unit="ops", width=12, min_value=0),
    )),
    ("Throughput", (
        PanelDef("Rollout tokens / s by kind", "timeseries", (Query(
            f"sum by ({BY_JOB}, kind) (rate(asyncrl_rollout_tokens_total{{{JOB}}}[{RATE}]))",
            f"{J} {{{{kind}}}}"),), "Tokens in returned trajectories per second (prompt, sampled, environment).",
            width=12, min_value=0),
        PanelDef("Trained tokens / s", "timeseries", (Query(
            f"sum by ({BY_JOB}) (rate(asyncrl_trained_tokens_total{{{JOB}}}[{RATE}]))", J),),
            "Sampled tokens handed to the actor per second, before the discrepancy mask.", width=12, min_value=0),
    )),
    ("Environments and agents", (
        PanelDef("Environment errors / s by reason", "timeseries", (Query(
            f"sum by ({BY_JOB}, reason) (rate(asyncrl_env_errors_total{{{JOB}}}[{RATE}]))",
            f"{J} {{{{reason}}}}"),),
            "Episodes the task's code aborted (the job goes on): exceptions, timeouts, NaN rewards, bad messages, "
            "reward services, and OpenAI-API agents (agent_*; docs/agents.md).", unit="ops", width=12, min_value=0),
        PanelDef("Agent requests, retries and branches / s", "timeseries", (
            Query(f"sum by ({BY_JOB}) (rate(asyncrl_agent_requests_total{{{JOB}}}[{RATE}]))", f"{J} requests"),
            Query(f"sum by ({BY_JOB}) (rate(asyncrl_agent_retries_total{{{JOB}}}[{RATE}]))", f"{J} retries"),
            Query(f"sum by ({BY_JOB}) (rate(asyncrl_agent_prefix_mismatch_total{{{JOB}}}[{RATE}]))",
                  f"{J} branches"),
        ), "Chat completions of ended agent sessions (one sampled turn each), SDK retries answered from the record, "
           "and requests that rewrote the history (a new branch each). Zero for a job without spec.task.agent.",
            unit="ops", width=12, min_value=0),
    )),
    ("Synchronisation", (
        PanelDef("Weight sync duration", "timeseries", (
            Query(_quantile(0.5, "asyncrl_weight_sync_duration_seconds"), f"{J} p50"),
            Query(_quantile(0.95, "asyncrl_weight_sync_duration_seconds"), f"{J} p95"),
        ), "From new weights to every rollout worker having acknowledged them.", unit="s", min_value=0),
        PanelDef("Interrupt-sync phase duration p95", "timeseries", (Query(
            _quantile(0.95, "asyncrl_sync_phase_duration_seconds", by=f"{BY_JOB}, phase"), f"{J} {{{{phase}}}}"),),
            "95th percentile of each interrupt-sync phase (interrupt, score, update, resume).",
            unit="s", min_value=0),
        PanelDef("Sync phase now", "phase", (Query(
            f"asyncrl_sync_phase{{{JOB}}} == 1", f"{J}: {{{{phase}}}}"),),
            "Current synchronisation phase (idle between syncs)."),
    )),
    ("Old-logit cost", (
        PanelDef("Reference (pi_ref) compute share", "timeseries", (Query(
            f"sum by ({BY_JOB}, reference) (rate(asyncrl_reference_seconds_total{{{JOB}}}[{RATE}]))\n"
            f"/ on ({BY_JOB}) group_left\n"
            f"sum by ({BY_JOB}) (rate(asyncrl_train_step_duration_seconds_sum{{{JOB}}}[{RATE}]))",
            f"{J} {{{{reference}}}}"),),
            "Seconds spent computing pi_ref per second of actor step time (the old-logit cost).",
            unit="percentunit", width=12, min_value=0),
        PanelDef("Actor step duration", "timeseries", (
            Query(_quantile(0.5, "asyncrl_train_step_duration_seconds"), f"{J} p50"),
            Query(_quantile(0.95, "asyncrl_train_step_duration_seconds"), f"{J} p95"),
        ), "Wall time of one actor step (reference log-probs, loss, backward, optimizer).",
            unit="s", width=12, min_value=0),
    )),
    ("Operator", (
        PanelDef("Reconcile latency", "timeseries", (
            Query("histogram_quantile(0.5, sum by (le) "
                  f"(rate(asyncrl_operator_reconcile_duration_seconds_bucket[{RATE}])))", "p50"),
            Query("histogram_quantile(0.95, sum by (le) "
                  f"(rate(asyncrl_operator_reconcile_duration_seconds_bucket[{RATE}])))", "p95"),
        ), "Time to reconcile one AsyncRLJob (operator-wide, not filtered by job).",
            unit="s", width=12, min_value=0),
        PanelDef("Reconcile errors / s", "timeseries", (Query(
            f"sum by (kind) (rate(asyncrl_operator_reconcile_errors_total[{RATE}]))", "{{kind}}"),),
            "Failed reconciles by kind: api (an API call failed) or unexpected (a bug). Operator-wide.",
            unit="ops", width=12, min_value=0),
    )),
)

# EWMA resets as annotations: a marker wherever the counter went up, titled with the reason.
EWMA_RESET_ANNOTATION = Query(
    f"sum by ({BY_JOB}, reason) (increase(asyncrl_ewma_resets_total{{{JOB}}}[{RATE}])) > 0",
    f"EWMA reset ({J}: {{{{reason}}}})",
)
# Template variable queries (Grafana's label_values over one series every driver exports).
NAMESPACE_VALUES = "label_values(asyncrl_policy_version, namespace)"
JOB_VALUES = 'label_values(asyncrl_policy_version{namespace=~"$namespace"}, asyncrljob)'


def substitute(expr: str, namespace: str = ".*", job: str = ".*", rate_interval: str = "1m") -> str:
    """``expr`` with the dashboard variables replaced, ready for Prometheus' HTTP API."""
    return (expr.replace("$__rate_interval", rate_interval)
            .replace("$namespace", namespace).replace("$job", job))


def panel_queries(namespace: str = ".*", job: str = ".*", rate_interval: str = "1m") -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel, variables substituted.

    ``namespace`` and ``job`` are regexes (Grafana's "All" is ``.*``); ``rate_interval`` replaces
    ``$__rate_interval`` (Grafana uses max(4 x scrape interval, step)).
    """
    return [(p.title, substitute(q.expr, namespace, job, rate_interval))
            for _, panels in ROWS for p in panels for q in p.queries]


def annotation_queries(namespace: str = ".*", job: str = ".*", rate_interval: str = "1m") -> list[tuple[str, str]]:
    """(annotation name, PromQL) of the dashboard's annotations; they return data only around an event."""
    return [("EWMA resets", substitute(EWMA_RESET_ANNOTATION.expr, namespace, job, rate_interval))]


def _target(q: Query, ref: str, kind: PanelKind) -> Dataquery:
    t = Dataquery().expr(q.expr).legend_format(q.legend).ref_id(ref).datasource(DATASOURCE)
    if kind == "heatmap":
        return t.format(PromQueryFormat.HEATMAP)
    if kind in ("stat", "phase"):
        return t.instant()
    return t.range()


def _panel(p: PanelDef, panel_id: int) -> cogbuilder.Builder[dbm.Panel]:
    b: timeseries.Panel | stat.Panel | heatmap.Panel
    if p.kind == "timeseries":
        b = timeseries.Panel().legend(cb.VizLegendOptions()
                                      .display_mode(common.LegendDisplayMode.LIST)
                                      .placement(common.LegendPlacement.BOTTOM).show_legend(True))
        for pattern, colour in p.threshold_lines:
            b = b.override_by_regexp(pattern, [
                dbm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": colour}),
                dbm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
            ])
    elif p.kind == "heatmap":
        b = heatmap.Panel().calculate(False).color(
            heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("Oranges"))
    else:  # stat, or phase: a stat showing the series' name (the phase label) instead of its value
        b = stat.Panel().graph_mode(common.BigValueGraphMode.NONE).reduce_options(
            cb.ReduceDataOptions().calcs(["lastNotNull"]))
        if p.kind == "phase":
            b = b.text_mode(common.BigValueTextMode.NAME).color_mode(common.BigValueColorMode.NONE)
    b = b.id(panel_id).title(p.title).description(p.description).datasource(DATASOURCE).unit(p.unit)
    b = b.span(p.width).height(8 if p.kind not in ("stat", "phase") else 5)
    if p.min_value is not None:
        b = b.min(p.min_value)
    for i, q in enumerate(p.queries):
        b = b.with_target(_target(q, chr(ord("A") + i), p.kind))
    return b


def _variables() -> list[db.DatasourceVariable | db.QueryVariable]:
    datasource = db.DatasourceVariable("datasource").label("Data source").type("prometheus")
    namespace = (db.QueryVariable("namespace").label("Namespace").datasource(DATASOURCE)
                 .query(NAMESPACE_VALUES).refresh(dbm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                 .multi(True).include_all(True).all_value(".*").sort(dbm.VariableSort.ALPHABETICAL_ASC))
    job = (db.QueryVariable("job").label("AsyncRLJob").datasource(DATASOURCE)
           .query(JOB_VALUES).refresh(dbm.VariableRefresh.ON_TIME_RANGE_CHANGED)
           .multi(True).include_all(True).all_value(".*").sort(dbm.VariableSort.ALPHABETICAL_ASC))
    return [datasource, namespace, job]


def build_dashboard() -> db.Dashboard:
    """The dashboard builder: variables, the EWMA-reset annotation, then one expanded row per ``ROWS`` entry."""
    d = (db.Dashboard("asyncrl: jobs").uid(UID)
         .description("AsyncRLJob health: mask guard, staleness pipeline, throughput, synchronisation, "
                      "old-logit cost and the operator. Generated by monitoring/dashboard.py; do not edit.")
         .tags(["asyncrl", "generated"]).editable().refresh("30s").time("now-3h", "now")
         .timezone(common.TimeZoneBrowser).tooltip(dbm.DashboardCursorSync.CROSSHAIR))
    for v in _variables():
        d = d.with_variable(v)
    d = d.annotation(db.AnnotationQuery().name("EWMA resets").datasource(DATASOURCE).enable(True)
                     .icon_color("purple"))  # its Prometheus query: _conform
    panel_id = 1
    for row_title, panels in ROWS:
        d = d.with_row(db.Row(row_title).id(panel_id))
        panel_id += 1
        for p in panels:
            d = d.with_panel(_panel(p, panel_id))
            panel_id += 1
    return d


def _encode(obj: object) -> object:
    return json.loads(JSONEncoder().encode(obj))


def _conform(data: dict) -> dict:  # type: ignore[type-arg]
    """Two gaps of the SDK closed so that the JSON matches Grafana 11.6's schema (``@grafana/schema``).

    1. The SDK writes the interval-variable fields ``auto``, ``auto_min``, ``auto_count`` on every
       variable; Grafana's dashboard schema has them on none (they mean something for interval
       variables only, and this dashboard has none): they are dropped.
    2. The SDK's ``AnnotationQuery.target`` models only Grafana's built-in tag annotations; a
       Prometheus annotation's query goes in ``target`` as a Prometheus query (where Grafana saves
       it), built with the SDK's Prometheus query builder.
    """
    for variable in data["templating"]["list"]:
        for key in ("auto", "auto_min", "auto_count"):
            variable.pop(key, None)
    for ann in data["annotations"]["list"]:
        if ann["name"] == "EWMA resets":
            ann.pop("expr", None)
            ann["target"] = _encode(_target(EWMA_RESET_ANNOTATION, "Anno", "timeseries").build())
    return data


def render_json() -> str:
    """The dashboard as the checked-in file holds it (sorted keys, two-space indent, final newline)."""
    data = _conform(_encode(build_dashboard().build()))  # type: ignore[arg-type]
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail when the checked-in JSON has drifted")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where the dashboard JSON goes")
    args = parser.parse_args(argv)
    text = render_json()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} differs from the generator; regenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
