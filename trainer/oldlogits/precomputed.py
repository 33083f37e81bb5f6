"""Exact old logits scored before the batch reaches the actor (``dedicated`` and ``interruptSync``).

Both strategies score every sampled token under its own version *while that version is resident
somewhere else*: the dedicated old-logit model as it follows the versions, or the rollout workers
during the interrupt-sync window. The scores travel with the trajectories (``Trajectory.logp_old``)
into ``TrainBatch.logp_old``. The actor adds only what it holds itself: tokens of its *own* version
``v``, from the ``logp_theta`` it passes to :meth:`PrecomputedProvider.logp_ref` -- the forward under
its weights *when the batch arrives*, which are exactly version ``v`` (with several updates per batch
a no-grad forward at arrival, never a later update's ``logp_theta``: by then the weights are no longer
``v``; with one update the gradient forward's detached output, the same numbers at no extra cost).

A trained token older than ``v`` that reaches the actor unscored is a bug of the stage: it raises,
naming the versions and how many tokens, and is never scored by another version silently.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.api.correction import ReferencePolicy
from asyncrl.trainer.oldlogits.protocol import NoScoringNoState, PaddedBatch


class UnscoredTokensError(RuntimeError):
    """Trained tokens of an older version arrived without their exact old log-probs."""


@dataclass
class PrecomputedProvider(NoScoringNoState):
    """``logp_ref`` = ``batch.logp_old`` (pre-scored), completed by the actor for its own version."""

    strategy: str  # "dedicated" or "interruptSync": who scored the tokens (said in errors)
    reference: ReferencePolicy = ReferencePolicy.EXACT
    extra_forward: bool = False

    def logp_ref(
        self, batch: PaddedBatch, logp_theta: Tensor, actor_version: int, scored: Tensor | None
    ) -> Tensor:
        """``[B, T]``: pre-scored tokens from ``batch.logp_old``, own-version tokens from ``logp_theta``."""
        own = batch.loss_mask & (batch.versions == actor_version)  # [B, T]
        old = batch.logp_old
        if old is None:
            old = torch.full_like(logp_theta, torch.nan)
        old = old.to(logp_theta.device, torch.float32)
        missing = batch.loss_mask & ~own & torch.isnan(old)
        if missing.any():
            versions = sorted({int(v) for v in batch.versions[missing].tolist()})
            raise UnscoredTokensError(
                f"oldLogits.strategy {self.strategy}: {int(missing.sum())} trained tokens of versions {versions} "
                f"reached the actor (version {actor_version}) without exact old log-probs; the {self.strategy} "
                "stage must score every token while its version is resident"
            )
        ref = torch.where(own, logp_theta.detach().float(), old)
        return torch.where(batch.loss_mask, ref, torch.zeros_like(ref)).detach()
