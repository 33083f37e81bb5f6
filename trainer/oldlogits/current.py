"""The ``current`` reference: the actor's weights when the batch arrives (decoupled PPO, most frameworks)."""

from dataclasses import dataclass

from torch import Tensor

from asyncrl.api.correction import ReferencePolicy
from asyncrl.trainer.oldlogits.protocol import NoScoringNoState, PaddedBatch


@dataclass
class CurrentProvider(NoScoringNoState):
    """``logp_ref`` = the ``logp_theta`` it is given, detached: the actor's weights when the batch arrives.

    The actor calls ``logp_ref`` once per batch, before the first update, and holds the result across
    every minibatch and epoch (decoupled PPO: after the first update ``pi_theta`` moves away from it
    and the clip acts on ``r_s``). With several updates it passes a no-grad forward run at arrival;
    with one update it passes the gradient forward's output, which runs under those same weights and
    is bit-identical to that extra forward (tested), so the single-update step costs no extra forward.
    """

    reference: ReferencePolicy = ReferencePolicy.CURRENT
    extra_forward: bool = False

    def logp_ref(
        self, batch: PaddedBatch, logp_theta: Tensor, actor_version: int, scored: Tensor | None
    ) -> Tensor:
        return logp_theta.detach()
