"""What a rollout worker answers for its share of an interrupt-sync window's scoring (paper §5.1).

``RolloutHost.sync_score`` scores, with the training-side model (:class:`~.segment_scorer.SegmentScorer`),
every unscored sampled token of the outgoing version -- of the episodes suspended on the worker and of the
finished trajectories the driver sent it -- and answers a :class:`ScoreResult` across Ray; the driver's
``InterruptSyncStage`` sets the scores on its trajectories and adds the timings to the run's summary.
A frozen record of plain lists and numbers: it pickles across Ray.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ScoreResult:
    """One worker's scoring of one interrupt-sync window. Seconds are wall-clock on the worker."""

    # Per trajectory the driver sent (same order): the positions scored and their log-probs (SegmentScorer.score).
    scores: list[tuple[list[int], list[float]]]
    tokens: int  # tokens scored in the window: the driver's trajectories and the suspended episodes
    release_seconds: float  # the engine's memory released (0 unless releaseRolloutResources)
    score_seconds: float  # load the version's weights and score
    acquire_seconds: float  # the engine's memory taken back
    scorer_build_seconds: float  # the model built in this window (first, or after a release freed it); else 0
    scorer_load_seconds: float  # the version's weights loaded into it
