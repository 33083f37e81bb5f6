"""What the loop counts: rollouts and correction statistics into the metrics, steps into a summary.

Plain functions over the catalogue's metrics (:mod:`.metrics`) and the per-step records.
"""

from collections.abc import Sequence
from typing import Any

from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus
from asyncrl.trainer.driver.metrics import TRAJECTORY_STATUSES, DriverMetrics


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


def count_correction(m: DriverMetrics, stats: dict[str, Any], reference: str, trained_tokens: int) -> None:
    """Turn one step's correction fractions back into token counts (numerator/denominator counters)."""
    valid = float(stats.get("valid_tokens", trained_tokens))
    m.trained_tokens.inc(trained_tokens)
    m.tokens_valid.labels(reference).inc(valid)
    m.tokens_kept.labels(reference).inc(round(valid * float(stats.get("keep_ratio", 1.0))))
    for side, key in (("low", "clip_low_frac"), ("high", "clip_high_frac"), ("dual", "dual_clip_frac")):
        m.tokens_clipped.labels(reference, side).inc(round(valid * float(stats.get(key, 0.0))))
    m.nonfinite_tokens.inc(float(stats.get("nonfinite_tokens", 0.0)))
    if stats.get("ewma_reset"):
        m.ewma_resets.labels(str(stats["ewma_reset_reason"])).inc()


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
