"""The route a job's old logits take: one name for the pair (``correction.reference``, ``oldLogits.strategy``).

Every part of the job that acts on the route (the driver's stage, the hosts it starts, the weight-sync wire and
the disk transport's retention, the rollout workers' scorer) reads :attr:`AsyncRLJobSpec.old_logits_route
<asyncrl.api.job.AsyncRLJobSpec.old_logits_route>` instead of comparing the two fields itself.
"""

from enum import StrEnum

from asyncrl.api.correction import CorrectionSpec, ReferencePolicy
from asyncrl.api.old_logits import OldLogitsSpec, OldLogitStrategy


class OldLogitsRoute(StrEnum):
    """How ``pi_old`` is obtained: ``none`` for a cheap reference (the actor computes ``logp_ref`` from what
    the batch carries), else the exact strategy of paper §5.1 (the values of :class:`OldLogitStrategy`)."""

    NONE = "none"
    SNAPSHOT = "snapshot"
    INTERRUPT_SYNC = "interruptSync"
    DEDICATED = "dedicated"

    @property
    def scores_outside_the_actor(self) -> bool:
        """``pi_old`` is scored by the training-side model code outside the actor (on the rollout workers, or
        by the dedicated scorers): they need the actor's weights at training precision."""
        return self in (OldLogitsRoute.INTERRUPT_SYNC, OldLogitsRoute.DEDICATED)


_BY_STRATEGY = {
    OldLogitStrategy.SNAPSHOT: OldLogitsRoute.SNAPSHOT,
    OldLogitStrategy.INTERRUPT_SYNC: OldLogitsRoute.INTERRUPT_SYNC,
    OldLogitStrategy.DEDICATED: OldLogitsRoute.DEDICATED,
}


def old_logits_route(correction: CorrectionSpec, old_logits: OldLogitsSpec) -> OldLogitsRoute:
    """The route of a validated spec (validation refuses ``reference: exact`` without a strategy, and a
    strategy without ``reference: exact``)."""
    if correction.reference is not ReferencePolicy.EXACT:
        return OldLogitsRoute.NONE
    if old_logits.strategy is None:
        raise ValueError("correction.reference is 'exact' but oldLogits.strategy is not set; set "
                         f"oldLogits.strategy to one of {', '.join(s.value for s in OldLogitStrategy)}")
    return _BY_STRATEGY[old_logits.strategy]
