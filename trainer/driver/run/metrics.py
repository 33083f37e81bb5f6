"""The driver's Prometheus metric catalogue: defined once here, documented from the same table.

``CATALOGUE`` is the single source: :func:`create_metrics` builds the metrics of one process
into a caller-supplied ``CollectorRegistry`` (tests use a private one) and
:func:`metrics_markdown` renders ``docs/metrics.md`` from it (a test fails when the file drifts;
regenerate with ``python -m asyncrl.trainer.driver.run.metrics docs/metrics.md``).

Conventions (Prometheus naming guide): one ``asyncrl_`` prefix, base units (seconds), counters
end in ``_total``; ratios are exported as numerator and denominator counters so that
``rate(num) / rate(den)`` is correct over any window; labels are bounded and every value is
pre-set to 0 so that series exist before the first event.
"""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import start_http_server

from asyncrl.api.correction import ReferencePolicy
from asyncrl.rollout.agent.limits import REFUSAL_REASONS, REFUSED_HELP, REFUSED_METRIC
from asyncrl.rollout.envs.runner import ENV_ERROR_REASONS
from asyncrl.trainer.correction.ewma_controller import ResetReason
from asyncrl.trainer.correction.ewma_reset import Outcome

REFERENCES = tuple(r.value for r in ReferencePolicy)
TRAJECTORY_STATUSES = ("finished", "truncated", "aborted")
DROP_REASONS = ("stale", "snapshot_cap", "reward_out_of_range", "over_length")
CLIP_SIDES = ("low", "high", "dual")
TOKEN_KINDS = ("prompt", "sampled", "environment")
# The EWMA controller's own reason names (paper §6.5 keep-ratio rule, or an explicit reset).
EWMA_RESET_REASONS: tuple[str, ...] = get_args(ResetReason)
EWMA_RESET_OUTCOMES: tuple[str, ...] = get_args(Outcome)
# spec.monitoring.maskGuard: warnKeepRatio -> warning, criticalKeepRatio -> critical (the alerts' severities).
MASK_GUARD_SEVERITIES = ("warning", "critical")
# Interrupt-sync phases of an update v -> v+1 (oldLogits.strategy interruptSync); idle between updates.
SYNC_PHASES = ("interrupt", "score", "update", "resume")
SYNC_STATES = ("idle", *SYNC_PHASES)


@dataclass(frozen=True)
class MetricDef:
    """One metric: its kind, full exposed name, help text, bounded labels and buckets."""

    attr: str
    kind: str  # counter | gauge | histogram | info
    name: str  # the name as exposed (counters include _total)
    help: str
    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()
    buckets: tuple[float, ...] = ()
    ratio: str = ""  # documents a numerator/denominator pair


_STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32, 64)
_STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_SYNC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
_PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600)

CATALOGUE: tuple[MetricDef, ...] = (
    MetricDef("job", "info", "asyncrl_job_info",
              "The running job: name, correction.reference (what produced pi_ref), async.maxStaleness, task."),
    MetricDef("policy_version", "gauge", "asyncrl_policy_version",
              "Version of the actor's weights (optimizer steps taken, including resumed ones)."),
    MetricDef("optimizer_steps", "counter", "asyncrl_optimizer_steps_total",
              "Optimizer steps applied by this process."),
    MetricDef("token_staleness", "histogram", "asyncrl_token_staleness_versions",
              "Version gap (actor version - token version) of every trained token when it reaches the actor.",
              buckets=_STALENESS_BUCKETS),
    MetricDef("tokens_kept", "counter", "asyncrl_discrepancy_kept_tokens_total",
              "Valid tokens kept by the train–inference discrepancy mask (and veto).",
              labels=(("reference", REFERENCES),), ratio="keep ratio = kept / valid"),
    MetricDef("tokens_valid", "counter", "asyncrl_discrepancy_valid_tokens_total",
              "Valid tokens seen by the correction loss (loss_mask True, all inputs finite), before the mask.",
              labels=(("reference", REFERENCES),), ratio="denominator of keep and clip ratios"),
    MetricDef("tokens_clipped", "counter", "asyncrl_staleness_clipped_tokens_total",
              "Valid tokens whose gradient the sign-aware PPO clip on r_s stops (side low, high or dual clip).",
              labels=(("reference", REFERENCES), ("side", CLIP_SIDES)),
              ratio="clip fraction = clipped / discrepancy_valid_tokens"),
    MetricDef("nonfinite_tokens", "counter", "asyncrl_nonfinite_tokens_total",
              "Trained tokens masked out of the loss because a log-prob or advantage was NaN/Inf."),
    MetricDef("nonfinite_losses", "counter", "asyncrl_nonfinite_losses_total",
              "Steps whose loss was NaN/Inf; the step is skipped (no weight update) and the batch is logged."),
    MetricDef("ewma_resets", "counter", "asyncrl_ewma_resets_total",
              "Resets of the PPO-EWMA reference theta_prox (to the current weights, or under reset.rule recentre to the average of the weights that sampled the batch), by reason.",
              labels=(("reason", EWMA_RESET_REASONS),)),
    MetricDef("ewma_reset_outcomes", "counter", "asyncrl_ewma_reset_outcomes_total",
              "EWMA reference resets by outcome, counted W = async.maxStaleness versions after each: recovered "
              "(the in-bounds ratio of r_d reached the reset's threshold in one of those versions) or unrecovered.",
              labels=(("outcome", EWMA_RESET_OUTCOMES),)),
    MetricDef("trajectories", "counter", "asyncrl_trajectories_total",
              "Trajectories returned by rollout workers, by how they ended.",
              labels=(("status", TRAJECTORY_STATUSES),)),
    MetricDef("trajectories_partial", "counter", "asyncrl_partial_trajectories_total",
              "Returned trajectories whose sampled tokens span more than one policy version (partial rollout).",
              ratio="partial ratio = partial / trajectories_total"),
    MetricDef("trajectories_dropped", "counter", "asyncrl_dropped_trajectories_total",
              "Trajectories dropped before training (stale: version gap above async.maxStaleness; snapshot_cap: "
              "their version's weights were given up at oldLogits.snapshot.maxVersions; reward_out_of_range: a "
              "reward not finite or over task.endpoint.maxRewardMagnitude; over_length: longer than the actor's "
              "context). The last two are refused as they return and count as aborted trajectories too.",
              labels=(("reason", DROP_REASONS),)),
    MetricDef("tokens_dropped", "counter", "asyncrl_dropped_tokens_total",
              "Sampled tokens of dropped trajectories.", labels=(("reason", DROP_REASONS),)),
    MetricDef("trajectories_scored", "counter", "asyncrl_scored_trajectories_total",
              "Finished or truncated trajectories scored by the environment.",
              ratio="denominator of success ratio and mean reward"),
    MetricDef("trajectories_succeeded", "counter", "asyncrl_succeeded_trajectories_total",
              "Scored trajectories the environment marked successful.", ratio="success ratio = succeeded / scored"),
    MetricDef("reward_sum", "counter", "asyncrl_reward_sum_total",
              "Sum of rewards of scored trajectories (built-in task rewards are in [0, 1]).",
              ratio="mean reward = reward_sum / scored"),
    MetricDef("rollout_tokens", "counter", "asyncrl_rollout_tokens_total",
              "Tokens in returned trajectories, by kind (prompt, agent-sampled, environment/tool).",
              labels=(("kind", TOKEN_KINDS),)),
    MetricDef("trained_tokens", "counter", "asyncrl_trained_tokens_total",
              "Sampled tokens handed to the actor (loss_mask True), before the discrepancy mask."),
    MetricDef("rollout_errors", "counter", "asyncrl_rollout_errors_total",
              "Rollout calls that raised (environment or worker error); their groups count as aborted."),
    MetricDef("env_errors", "counter", "asyncrl_env_errors_total",
              "Episodes aborted by their environment's code (the job goes on), by reason: exception (reset or "
              "step raised), timeout (past task.envTimeoutSeconds), nonfinite_reward, bad_messages (not chat "
              "messages, or text the tokenizer cannot encode); a reward or environment service (docs/tasks.md): "
              "remote_unreachable (down), remote_timeout, remote_http_error (4xx, or 5xx after the retries), "
              "remote_bad_response (not the protocol's JSON); an OpenAI-API agent (docs/agents.md): agent_exception "
              "(raised, or returned no number), agent_bad_request (a malformed or oversized request or reward), "
              "agent_no_request (ended without calling the model), agent_no_reward (returned None with no "
              "task.reward to score it).",
              labels=(("reason", ENV_ERROR_REASONS),),
              ratio="environment error ratio = env_errors / trajectories"),
    MetricDef("agent_sessions", "counter", "asyncrl_agent_sessions_total",
              "Agent sessions (episodes of spec.task.agent) that ended and reached the driver."),
    MetricDef("agent_requests", "counter", "asyncrl_agent_requests_total",
              "Chat-completion requests of ended agent sessions, each one sampled assistant turn.",
              ratio="turns per session = agent_requests / agent_sessions"),
    MetricDef("agent_retries", "counter", "asyncrl_agent_retries_total",
              "Repeated requests (an SDK retry after a timeout or a lost answer) answered with the recorded turn, "
              "never sampled again."),
    MetricDef("agent_prefix_mismatch", "counter", "asyncrl_agent_prefix_mismatch_total",
              "Requests that did not extend their session's conversation (the harness edited or truncated the "
              "history): each starts a new branch, trained as its own trajectory.",
              ratio="branch ratio = agent_prefix_mismatch / agent_requests"),
    MetricDef("agent_refused", "counter", REFUSED_METRIC,
              REFUSED_HELP + " The driver adds up its rollout workers' counts at every step.",
              labels=(("reason", REFUSAL_REASONS),)),
    MetricDef("worker_replacements", "counter", "asyncrl_worker_replacements_total",
              "Processes of the job that died and were replaced while the job continued, by role "
              "(rollout: a rollout worker; oldlogits: a dedicated old-logit scorer).",
              labels=(("role", ("rollout", "oldlogits")),)),
    MetricDef("step_duration", "histogram", "asyncrl_train_step_duration_seconds",
              "Wall time of one actor step (reference log-probs, loss, backward, optimizer).",
              buckets=_STEP_BUCKETS),
    MetricDef("weight_sync_duration", "histogram", "asyncrl_weight_sync_duration_seconds",
              "Wall time from new weights to every rollout worker having acknowledged them.",
              buckets=_SYNC_BUCKETS),
    MetricDef("weight_sync_transfer", "histogram", "asyncrl_weight_sync_transfer_seconds",
              "Per weight sync, the slowest rollout worker's time taking the version's buckets off the "
              "transport (actor.weightSync: object-store pull, broadcast collective or file read) and "
              "reassembling them; generation keeps running meanwhile.",
              buckets=_SYNC_BUCKETS),
    MetricDef("weight_sync_pause", "histogram", "asyncrl_weight_sync_pause_seconds",
              "Per weight sync, the slowest rollout worker's time with generation stopped for new weights: "
              "installing them at a token boundary (interruptSync: the whole interrupt-to-resume window).",
              buckets=_SYNC_BUCKETS),
    MetricDef("rollout_idle", "counter", "asyncrl_rollout_idle_seconds_total",
              "Worker-seconds rollout workers spent without a generate call (blocked by staleness capacity).",
              ratio="rollout idle ratio = rollout_idle / rollout_worker"),
    MetricDef("rollout_worker", "counter", "asyncrl_rollout_worker_seconds_total",
              "Worker-seconds of rollout workers' lifetime in the loop (denominator of the idle ratio)."),
    MetricDef("trainer_idle", "counter", "asyncrl_trainer_idle_seconds_total",
              "Seconds the actor waited for a full batch.", ratio="trainer idle ratio = trainer_idle / trainer"),
    MetricDef("trainer_seconds", "counter", "asyncrl_trainer_seconds_total",
              "Seconds of the training loop (denominator of the trainer idle ratio)."),
    MetricDef("buffer_ready", "gauge", "asyncrl_buffer_ready_groups",
              "GRPO groups waiting in the staleness buffer."),
    MetricDef("rollout_running", "gauge", "asyncrl_rollout_running_groups",
              "GRPO groups admitted and still being generated."),
    MetricDef("admission_capacity", "gauge", "asyncrl_admission_capacity_groups",
              "Groups rollout may still start at the current version (AReaL staleness capacity)."),
    MetricDef("mask_guard_threshold", "gauge", "asyncrl_mask_guard_keep_ratio_threshold",
              "The job's mask-guard keep-ratio thresholds (spec.monitoring.maskGuard warnKeepRatio, "
              "criticalKeepRatio): the alert rules compare the keep ratio with these.",
              labels=(("severity", MASK_GUARD_SEVERITIES),)),
    MetricDef("max_staleness", "gauge", "asyncrl_max_staleness_versions",
              "The job's staleness bound W (spec.async.maxStaleness): no trained token is older than this."),
    MetricDef("importance_ess", "gauge", "asyncrl_importance_ess_ratio",
              "Effective sample size of the discrepancy weights over the valid tokens of the last step, "
              "divided by the valid tokens: (sum w)^2 / (n sum w^2), 1 when every weight is equal."),
    MetricDef("kl_k3", "gauge", "asyncrl_kl_k3",
              "k3 estimate of KL(pi_theta || pi_ref) over the valid tokens of the last step."),
    MetricDef("reference_seconds", "counter", "asyncrl_reference_seconds_total",
              "Seconds the actor spent computing pi_ref (the old-logit / reference forward passes), by reference.",
              labels=(("reference", REFERENCES),), ratio="reference share = reference / trainer_seconds"),
    MetricDef("sync_phase_duration", "histogram", "asyncrl_sync_phase_duration_seconds",
              "Wall time of each interrupt-sync phase of an update (oldLogits.strategy interruptSync; "
              "empty until that strategy runs).",
              labels=(("phase", SYNC_PHASES),), buckets=_PHASE_BUCKETS),
    MetricDef("sync_phase", "gauge", "asyncrl_sync_phase",
              "1 for the current interrupt-sync phase (idle between updates), 0 for the others.",
              labels=(("phase", SYNC_STATES),)),
    MetricDef("snapshot_versions", "gauge", "asyncrl_snapshot_resident_versions",
              "Weight versions the actor keeps after the last step (oldLogits.strategy snapshot, or the audit): "
              "exactly those an untrained token still references."),
    MetricDef("snapshot_bytes", "gauge", "asyncrl_snapshot_resident_bytes",
              "Bytes of those weight versions (host memory, or files for snapshot.device disk)."),
    MetricDef("audit_abs_diff", "gauge", "asyncrl_audit_logp_abs_diff",
              "Live audit of a cheap reference (correction.audit): mean and p99 of |log pi_ref - log pi_old| "
              "over the audited tokens of the last audited step (pi_old exact, from weight snapshots).",
              labels=(("reference", REFERENCES), ("stat", ("mean", "p99")))),
    MetricDef("startup_log_ratio", "gauge", "asyncrl_startup_log_ratio_abs",
              "Start-up discrepancy probe (correction.startupCheck): mean and p99 of |log pi_theta - log mu| over "
              "the probe's sampled tokens, of the worst rollout engine, at the version training starts from.",
              labels=(("stat", ("mean", "p99")),)),
    MetricDef("audit_tokens", "counter", "asyncrl_audit_tokens_total",
              "Trained tokens the live audit compared with exact old logits.",
              labels=(("reference", REFERENCES),)),
    MetricDef("audit_disagree_tokens", "counter", "asyncrl_audit_disagree_tokens_total",
              "Audited tokens whose decision differs between the cheap reference and exact old logits: "
              "mask (train-inference mask keep/drop) or clip (PPO clip stops the gradient or not).",
              labels=(("reference", REFERENCES), ("decision", ("mask", "clip"))),
              ratio="disagreement = audit_disagree_tokens / audit_tokens"),
    MetricDef("optimizer_updates", "counter", "asyncrl_optimizer_updates_total",
              "Optimizer updates of the actor (train.minibatches x train.epochs per consumed batch), by outcome "
              "(skipped: a non-finite loss or gradient norm; the batch's other updates still apply).",
              labels=(("outcome", ("applied", "skipped")),)),
    MetricDef("in_bounds_ratio", "gauge", "asyncrl_in_bounds_ratio",
              "Share of the last batch's valid tokens whose r_d lies inside correction.mask.bounds, whatever "
              "mask.mode (the statistic of the EWMA reset rule)."),
    MetricDef("route_flip_tokens", "counter", "asyncrl_route_flip_tokens_total",
              "Trained tokens whose replayed MoE routes (correction.routingReplay) the training forward's own "
              "router would have changed in at least one layer.",
              ratio="route-flip share = route_flip_tokens / route_replayed_tokens"),
    MetricDef("route_replayed_tokens", "counter", "asyncrl_route_replayed_tokens_total",
              "Trained tokens whose training forward replayed MoE routes (correction.routingReplay rollout or "
              "oldLogits; 0 without replay).",
              ratio="denominator of the route-flip share"),
    MetricDef("oldlogits_lag", "gauge", "asyncrl_oldlogits_lag_versions",
              "How many versions the dedicated old-logit scorers trail the actor at the last step "
              "(oldLogits.strategy dedicated; bounded by maxLagVersions)."),
    MetricDef("oldlogits_wait_seconds", "counter", "asyncrl_oldlogits_wait_seconds_total",
              "Seconds the driver held a batch until the dedicated old-logit scorers had scored its older "
              "tokens (or caught up within maxLagVersions)."),
    MetricDef("eval_success", "gauge", "asyncrl_eval_success",
              "Share of the held-out evaluation prompts solved by the last evaluated version (spec.eval; one "
              "sample per prompt, greedy or at task.temperature)."),
    MetricDef("eval_reward", "gauge", "asyncrl_eval_reward",
              "Mean reward over the held-out evaluation prompts of the last evaluated version."),
    MetricDef("eval_version", "gauge", "asyncrl_eval_version",
              "The policy version the last evaluation ran at (-1 before the first one)."),
    MetricDef("eval_seconds", "counter", "asyncrl_eval_seconds_total",
              "Seconds of evaluation pauses (admission paused, in-flight training calls drained, held-out "
              "prompts answered); left out of the trainer and rollout idle accounting."),
    MetricDef("eval_trajectories", "counter", "asyncrl_eval_trajectories_total",
              "Held-out evaluation samples generated (never trained on, never in the staleness buffer)."),
    MetricDef("audit_seconds", "counter", "asyncrl_audit_seconds_total",
              "Seconds the actor spent on the live audit's exact forwards.",
              labels=(("reference", REFERENCES),)),
)


class DriverMetrics:
    """The catalogue's metrics in one registry; attribute names are ``MetricDef.attr``."""

    def __getattr__(self, name: str) -> Any:  # attributes are set from CATALOGUE in __init__
        raise AttributeError(f"no metric {name!r}; valid: {', '.join(d.attr for d in CATALOGUE)}")

    def __init__(self, registry: CollectorRegistry, defs: tuple[MetricDef, ...] = CATALOGUE) -> None:
        self.registry = registry
        for d in defs:
            labelnames = [name for name, _ in d.labels]
            metric: Counter | Gauge | Histogram | Info
            if d.kind == "counter":
                metric = Counter(d.name.removesuffix("_total"), d.help, labelnames, registry=registry)
            elif d.kind == "gauge":
                metric = Gauge(d.name, d.help, labelnames, registry=registry)
            elif d.kind == "histogram":
                metric = Histogram(d.name, d.help, labelnames, registry=registry, buckets=d.buckets)
            elif d.kind == "info":
                metric = Info(d.name.removesuffix("_info"), d.help, registry=registry)
            else:
                raise ValueError(f"{d.name}: unknown kind {d.kind!r}; valid: counter, gauge, histogram, info")
            # Pre-set every bounded label combination to 0 so that the series exist from the start.
            for combo in _combinations(d.labels):
                metric.labels(*combo)
            setattr(self, d.attr, metric)


def _combinations(labels: tuple[tuple[str, tuple[str, ...]], ...]) -> list[tuple[str, ...]]:
    if not labels:
        return []
    out: list[tuple[str, ...]] = [()]
    for _, values in labels:
        out = [(*prefix, v) for prefix in out for v in values]
    return out


def create_metrics(registry: CollectorRegistry) -> DriverMetrics:
    """The driver's metrics, registered in ``registry``."""
    return DriverMetrics(registry)


@dataclass
class MetricsServer:
    """A running ``/metrics`` HTTP endpoint."""

    host: str
    port: int
    _server: object

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()  # type: ignore[attr-defined]
        self._server.server_close()  # type: ignore[attr-defined]


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve ``registry`` on ``host:port`` (port 0 picks a free port) in a daemon thread."""
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise OSError(
            f"cannot serve metrics on {host}:{port} ({exc.strerror}); set spec.monitoring.port to a free "
            "port, or pass --port 0 to pick one"
        ) from exc
    return MetricsServer(host, server.server_port, server)


def metrics_markdown(defs: tuple[MetricDef, ...] = CATALOGUE) -> str:
    """``docs/metrics.md``, rendered from the catalogue."""
    lines = [
        "# Metrics",
        "",
        "<!-- Generated from asyncrl.trainer.driver.run.metrics.CATALOGUE; do not edit by hand. -->",
        "<!-- Regenerate: python -m asyncrl.trainer.driver.run.metrics docs/metrics.md -->",
        "",
        "The job driver (`asyncrl run`, or the driver pod) serves these on `/metrics`",
        "(`spec.monitoring.port`, bound to 127.0.0.1 locally). Ratios are exported as a numerator and a",
        "denominator counter: compute them as `rate(numerator[5m]) / rate(denominator[5m])`. Every",
        "label value listed is pre-set to 0.",
        "",
        "| metric | type | labels | meaning | ratio |",
        "|---|---|---|---|---|",
    ]
    for d in defs:
        labels = "<br>".join(f"`{n}`: {', '.join(v)}" for n, v in d.labels) or "-"
        lines.append(f"| `{d.name}` | {d.kind} | {labels} | {d.help} | {d.ratio or '-'} |")
    lines += ["", "Histogram buckets:", ""]
    for d in defs:
        if d.kind == "histogram":
            lines.append(f"- `{d.name}`: {', '.join(f'{b:g}' for b in d.buckets)}")
    lines += [
        "",
        "The run directory's `metrics.jsonl` has one line per step with the same quantities as",
        "per-step values: the correction loss's counts and sums (`valid_tokens`, `kept_tokens`,",
        "`clip_low_tokens`, ..., see `docs/correction-metrics.md`) with the fractions derived from them",
        "(`keep_ratio`, `clip_low_frac`, ...), `reward_mean`, `success_rate`, `staleness_mean`,",
        "`staleness_max`, `ewma_reset`, ...",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = metrics_markdown()
    if args:
        Path(args[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
