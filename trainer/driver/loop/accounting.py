"""What the loop counts: rollouts and correction statistics into the metrics, steps into a summary.

Plain functions over the catalogue's metrics (:mod:`.metrics`) and the actor's typed step report
(:class:`~asyncrl.trainer.actor.reports.TrainStepMetrics`). The correction loss's counts arrive as its
own record (:class:`CorrectionStats`) and go into the counters as they are: nothing is divided and
multiplied back. :func:`summarise` adds up the ``metrics.jsonl`` lines (a resumed run's earlier lines too), typed by
:mod:`.metrics_log`, into the summary's :class:`StepTotals`.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.envs.runner import ENV_ERROR_REASONS
from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus
from asyncrl.trainer.correction.stats import CorrectionStats
from asyncrl.trainer.driver.run.metrics import SYNC_STATES, TRAJECTORY_STATUSES, DriverMetrics
from asyncrl.trainer.driver.run.metrics_log import EvalLine, Line, StepLine, parse_lines
from asyncrl.trainer.driver.run.summary import EvalPoint, StepTotals

if TYPE_CHECKING:
    from asyncrl.trainer.actor.reports import TrainStepMetrics
    from asyncrl.trainer.driver.loop.evaluation import EvalResult


def set_job_gauges(m: DriverMetrics, spec: AsyncRLJobSpec) -> None:
    """The job's constants the alert rules compare with (thresholds, W) and the idle sync phase."""
    guard = spec.monitoring.mask_guard
    m.mask_guard_threshold.labels("warning").set(guard.warn_keep_ratio)
    m.mask_guard_threshold.labels("critical").set(guard.critical_keep_ratio)
    m.max_staleness.set(spec.async_.max_staleness)
    m.eval_version.set(-1)  # no evaluation yet
    set_sync_phase(m, "idle")


def set_sync_phase(m: DriverMetrics, phase: str) -> None:
    """``asyncrl_sync_phase{phase}``: 1 for ``phase``, 0 for the others (one-hot)."""
    if phase not in SYNC_STATES:
        raise ValueError(f"unknown sync phase {phase!r}; valid: {', '.join(SYNC_STATES)}")
    for p in SYNC_STATES:
        m.sync_phase.labels(p).set(1.0 if p == phase else 0.0)


def count_rollouts(m: DriverMetrics, trajs: Sequence[Trajectory]) -> None:
    """Count one generate call's trajectories (status, partial, success, reward, tokens by kind)."""
    for t in trajs:
        agent = t.info.get("agent")
        if isinstance(agent, dict):  # an agent session's counts travel on its last branch (rollout/agent/)
            m.agent_sessions.inc()
            m.agent_requests.inc(int(agent.get("requests", 0)))
            m.agent_retries.inc(int(agent.get("retries", 0)))
            m.agent_prefix_mismatch.inc(int(agent.get("branches", 0)))
        # INTERRUPTED snapshots are never handed to the driver by generate(); count one as aborted.
        m.trajectories.labels(t.status.value if t.status.value in TRAJECTORY_STATUSES else "aborted").inc()
        if t.status is TrajectoryStatus.ABORTED:
            if t.info.get("env_error") in ENV_ERROR_REASONS:  # the episode's environment failed
                m.env_errors.labels(t.info["env_error"]).inc()
            continue
        m.trajectories_partial.inc(int(t.is_partial))
        m.trajectories_scored.inc()
        m.trajectories_succeeded.inc(int(t.success))
        m.reward_sum.inc(max(0.0, t.reward))
        sampled = sum(t.loss_mask)
        m.rollout_tokens.labels("prompt").inc(t.prompt_len)
        m.rollout_tokens.labels("sampled").inc(sampled)
        m.rollout_tokens.labels("environment").inc(len(t.tokens) - t.prompt_len - sampled)


def count_refusals(m: DriverMetrics, seen: dict[str, int], now: dict[str, int]) -> None:
    """One rollout worker's endpoint refusals (``asyncrl_agent_requests_refused_total``, a running count per reason)
    into the driver's counter: what is new since ``seen`` (its last count, updated here). A replaced worker starts
    again from 0: a count below the last one is all new."""
    for reason, n in now.items():
        last = seen.get(reason, 0)
        m.agent_refused.labels(reason).inc(n - last if n >= last else n)
        seen[reason] = n


def count_correction(m: DriverMetrics, stats: CorrectionStats[float], reference: str, trained_tokens: int) -> None:
    """One applied step's correction counts into the numerator/denominator counters, and the
    last-step gauges (ESS ratio, k3 KL between pi_theta and pi_ref)."""
    m.trained_tokens.inc(trained_tokens)
    m.tokens_valid.labels(reference).inc(stats.valid_tokens)
    m.tokens_kept.labels(reference).inc(stats.kept_tokens)
    clipped = (("low", stats.clip_low_tokens), ("high", stats.clip_high_tokens), ("dual", stats.dual_clip_tokens))
    for side, n in clipped:
        m.tokens_clipped.labels(reference, side).inc(n)
    m.nonfinite_tokens.inc(stats.nonfinite_tokens)
    m.importance_ess.set(stats.ess)
    m.kl_k3.set(stats.kl_k3_theta_ref)


def count_old_logits(m: DriverMetrics, step: "TrainStepMetrics", reference: str) -> None:
    """One applied step's updates, snapshot residency and, on audited steps, the live audit's numbers."""
    m.optimizer_updates.labels("applied").inc(step.updates_applied)
    m.optimizer_updates.labels("skipped").inc(step.updates_skipped)
    m.in_bounds_ratio.set(step.in_bounds_ratio)
    m.route_flip_tokens.inc(step.route_flips)  # routing replay (0 without)
    m.route_replayed_tokens.inc(step.route_tokens)
    m.snapshot_versions.set(step.snapshot_resident_versions)  # the resident count (never the cap)
    m.snapshot_bytes.set(step.snapshot_resident_bytes)
    m.audit_seconds.labels(reference).inc(step.audit_seconds)
    audit = step.audit
    if audit is None:
        return
    m.audit_abs_diff.labels(reference, "mean").set(audit.abs_diff_mean)
    m.audit_abs_diff.labels(reference, "p99").set(audit.abs_diff_p99)
    m.audit_tokens.labels(reference).inc(audit.tokens)
    m.audit_disagree_tokens.labels(reference, "mask").inc(audit.mask_disagree_tokens)
    m.audit_disagree_tokens.labels(reference, "clip").inc(audit.clip_disagree_tokens)


def count_ewma_reset(m: DriverMetrics, reason: str, outcome: str = "") -> None:
    """One automatic (or manual) reset of the EWMA reference; ``""``: no reset this step. ``outcome``: an
    earlier reset's outcome decided at this step (``recovered`` / ``unrecovered``; ``""``: none)."""
    if reason:
        m.ewma_resets.labels(reason).inc()
    if outcome:
        m.ewma_reset_outcomes.labels(outcome).inc()


def count_eval(m: DriverMetrics, result: "EvalResult") -> None:
    """One evaluation of the current policy (:mod:`.evaluation`) into the gauges and counters."""
    m.eval_success.set(result.success)
    m.eval_reward.set(result.reward)
    m.eval_version.set(result.version)
    m.eval_seconds.inc(result.seconds)
    m.eval_trajectories.inc(result.prompts)


def success_rate(groups: Sequence[Sequence[Trajectory]]) -> float:
    trajs = [t for g in groups for t in g]
    return sum(t.success for t in trajs) / max(1, len(trajs))


def summarise(records: Sequence[Line], wall_s: float, window: int = 10) -> StepTotals:
    """From the run's ``metrics.jsonl`` lines (a resumed log included, so read back as text): start/final
    success and reward (means over the first/last ``window`` applied steps), wall time, and the held-out
    evaluation's first/last success and curve (``eval_*``; None/empty without one)."""

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    lines = parse_lines(records)
    ok = [r for r in lines if isinstance(r, StepLine) and r.applied]  # the applied steps
    evals = [r for r in lines if isinstance(r, EvalLine)]  # evaluations of the current policy, in order
    curve = tuple(EvalPoint(version=r.version, success=round(r.success, 4), reward=round(r.reward, 4),
                            seconds=r.seconds, loop_s=round(t, 3))
                  for r, t in zip(evals, eval_loop_seconds(evals), strict=True))
    success = [r.success_rate for r in ok if r.success_rate is not None]
    reward = [r.reward_mean for r in ok if r.reward_mean is not None]
    return StepTotals(
        steps_done=len(ok), wall_s=round(wall_s, 2),
        start_success=mean(success[:window]), final_success=mean(success[-window:]),
        start_reward=mean(reward[:window]), final_reward=mean(reward[-window:]),
        final_version=ok[-1].version if ok else None,
        # held-out evaluation (spec.eval): first and last evaluated success, and every evaluation
        eval_first=curve[0].success if curve else None,
        eval_last=curve[-1].success if curve else None,
        eval_first_version=curve[0].version if curve else None,
        eval_last_version=curve[-1].version if curve else None,
        eval_curve=curve,
        eval_s=round(sum(r.seconds if r.seconds is not None else 0.0 for r in evals), 3),
    )


def eval_loop_seconds(evals: Sequence[EvalLine]) -> list[float]:
    """Training-loop seconds at which each evaluation saw its version: wall time since the first
    evaluation (version 0, at the loop's start) without the evaluations' own time (``eval_s``, the
    drain included), so runs that evaluate equally often compare at equal training wall-clock."""
    if not evals:
        return []
    spent = 0.0
    out = []
    for r in evals[1:]:
        spent += float(r.seconds or 0.0)
        out.append(max(0.0, float(r.wall_s) - float(evals[0].wall_s) - spent))
    return [0.0, *out]
