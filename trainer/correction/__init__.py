"""The off-policy correction core: decoupled loss, discrepancy modes, staleness clip, metrics,
and the PPO-EWMA controller (reference policies: ``asyncrl.trainer.oldlogits``) (paper §3–5, docs/architecture.md, notation)."""

from asyncrl.trainer.correction.clip import Clip, ppo_clip
from asyncrl.trainer.correction.discrepancy import (
    LEVELS,
    MODES,
    SAFETY_BOUND,
    Discrepancy,
    ModeRule,
    discrepancy_weights,
)
from asyncrl.trainer.correction.ewma_controller import EwmaController, EwmaStepReport
from asyncrl.trainer.correction.loss import CorrectionResult, correction_loss, decoupled_pg_loss
from asyncrl.trainer.correction.stats import METRICS, CorrectionStats, MetricDoc, metrics_markdown

__all__ = [
    "LEVELS",
    "METRICS",
    "MODES",
    "SAFETY_BOUND",
    "Clip",
    "CorrectionResult",
    "CorrectionStats",
    "Discrepancy",
    "EwmaController",
    "EwmaStepReport",
    "MetricDoc",
    "ModeRule",
    "correction_loss",
    "decoupled_pg_loss",
    "discrepancy_weights",
    "metrics_markdown",
    "ppo_clip",
]
