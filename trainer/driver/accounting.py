"""What the loop counts: rollouts and correction statistics into the metrics, steps into a summary.

Plain functions over the catalogue's metrics (:mod:`.metrics`) and the per-step records. The
correction loss's counts arrive as its own record (:class:`CorrectionStats`) and go into the
counters as they are: nothing is divided and multiplied back.
"""

from collections.abc import Sequence
from typing import Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus
from asyncrl.trainer.correction.stats import CorrectionStats
from asyncrl.trainer.driver.metrics import SYNC_STATES, TRAJECTORY_STATUSES, DriverMetrics


def set_job_gauges(m: DriverMetrics, spec: AsyncRLJobSpec) -> None:
    """The job's constants the alert rules compare with (thresholds, W) and the idle sync phase."""
    guard = spec.monitoring.mask_guard
    m.mask_guard_threshold.labels("warning").set(guard.warn_keep_ratio)
    m.mask_guard_threshold.labels("critical").set(guard.critical_keep_ratio)
    m.max_staleness.set(spec.async_.max_staleness)
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
        # INTERRUPTED snapshots are never handed to the driver by generate(); count one as aborted.
        m.trajectories.labels(t.status.value if t.status.value in TRAJECTORY_STATUSES else "aborted").inc()
        if t.status is TrajectoryStatus.ABORTED:
            continue
        m.trajectories_partial.inc(int(t.is_partial))
        m.trajectories_scored.inc()
        m.trajectories_succeeded.inc(int(t.success))
        m.reward_sum.inc(max(0.0, t.reward))
        sampled = sum(t.loss_mask)
        m.rollout_tokens.labels("prompt").inc(t.prompt_len)
        m.rollout_tokens.labels("sampled").inc(sampled)
        m.rollout_tokens.labels("environment").inc(len(t.tokens) - t.prompt_len - sampled)


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


def count_ewma_reset(m: DriverMetrics, reason: str) -> None:
    """One automatic (or manual) reset of the EWMA reference; ``""``: no reset this step."""
    if reason:
        m.ewma_resets.labels(reason).inc()


def success_rate(groups: Sequence[Sequence[Trajectory]]) -> float:
    trajs = [t for g in groups for t in g]
    return sum(t.success for t in trajs) / max(1, len(trajs))


def summarise(records: Sequence[dict[str, Any]], wall_s: float, window: int = 10) -> dict[str, Any]:
    """Start/final success and reward (means over the first/last ``window`` applied steps), wall time."""

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    ok = [r for r in records if "version" in r]  # steps whose update was applied
    return {
        "steps_done": len(ok), "wall_s": round(wall_s, 2),
        "start_success": mean([r["success_rate"] for r in ok[:window]]),
        "final_success": mean([r["success_rate"] for r in ok[-window:]]),
        "start_reward": mean([r["reward_mean"] for r in ok[:window]]),
        "final_reward": mean([r["reward_mean"] for r in ok[-window:]]),
        "final_version": ok[-1]["version"] if ok else None,
    }
