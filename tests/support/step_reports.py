"""Typed step reports as the loop makes them, for tests of what reads them (status reporter, console, lines)."""

from dataclasses import fields
from typing import Any

from asyncrl.trainer.actor.reports import TrainStepMetrics
from asyncrl.trainer.correction.stats import CorrectionStats
from asyncrl.trainer.driver.run.step_report import ActorStep, StepReport, WeightSync


def correction_counts(valid: float = 100, keep: float = 1.0, clip_low: float = 0.0,
                      clip_high: float = 0.0) -> CorrectionStats[float]:
    """Counts of ``valid`` tokens: ``keep`` of them kept, ``clip_low``/``clip_high`` of them clipped."""
    counts = {f.name: 0.0 for f in fields(CorrectionStats)}
    counts |= {"valid_tokens": valid, "kept_tokens": valid * keep, "clip_low_tokens": valid * clip_low,
               "clip_high_tokens": valid * clip_high, "rd_min": 1.0, "rd_max": 1.0, "rs_min": 1.0, "rs_max": 1.0}
    return CorrectionStats(**counts)


def step_report(version: int, valid: float = 100, keep: float = 1.0, clip_low: float = 0.0,
                clip_high: float = 0.0, staleness: int = 0, *, applied: bool = True, ewma_reset: bool = False,
                env_errors: int = 0, sync: WeightSync | None = None, **changes: Any) -> StepReport:
    """The report of the step that made ``version`` (applied) or stayed below it (not applied)."""
    metrics = TrainStepMetrics(
        version=version if applied else version - 1, reference="behavior", applied=applied, loss=0.5,
        grad_norm=1.0, valid_tokens=int(valid), nonfinite_loss_total=0 if applied else 1, nonfinite_grad_total=0,
        ewma_reset=ewma_reset, ewma_reset_reason="keep_ratio" if ewma_reset else "", ewma_resets_total=0,
        reference_seconds=0.0, forward_seconds=0.1, backward_seconds=0.2,
        correction=correction_counts(valid, keep, clip_low, clip_high),
        updates_applied=1 if applied else 0, updates_skipped=0 if applied else 1,
    )
    report = StepReport(step=version, wall_s=1.0, reward_mean=0.5, success_rate=0.5, staleness_mean=0.0,
                        staleness_max=staleness, trajectories=8, partial_frac=0.0, step_s=0.3,
                        env_errors=env_errors, actor=ActorStep(metrics, publish_seconds=0.01 if applied else 0.0,
                                                               batch_summary={} if applied else {"rows": 8.0}),
                        sync=sync if sync is not None or not applied else WeightSync(0.05))
    return report.with_(**changes) if changes else report
