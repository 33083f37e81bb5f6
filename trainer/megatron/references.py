"""Where the actor gets ``logp_ref`` for each ``spec.correction.reference`` (ARCHITECTURE §1).

A registry keyed by :class:`~asyncrl.api.correction.ReferencePolicy`. Each rule runs in one of two
phases of a train step:

- ``before`` the gradient forward, for references that need their own forward pass or come with
  the batch (``ewma``: weights are swapped in place, which must happen before autograd saves any
  parameter for backward; ``exact``: the caller's ``logp_ref``);
- ``after`` it, for references computed from ``logp_theta`` (``behavior``, ``current``,
  ``linear``, ``loglinear``).

Every reference is returned detached: the loss is differentiable w.r.t. ``logp_theta`` only.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from asyncrl.api.correction import ReferencePolicy
from asyncrl.trainer.megatron.batch import TrainBatch

if TYPE_CHECKING:
    from asyncrl.trainer.megatron.actor import MegatronActor

BeforeFn = Callable[["MegatronActor", TrainBatch], torch.Tensor]
AfterFn = Callable[["MegatronActor", TrainBatch, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ReferenceRule:
    """How one reference policy is obtained (exactly one of ``before`` / ``after`` is set)."""

    before: BeforeFn | None = None
    after: AfterFn | None = None
    extra_forward: bool = False  # costs one no-grad forward of the actor model


def _behavior(actor: "MegatronActor", batch: TrainBatch, logp_theta: torch.Tensor) -> torch.Tensor:
    # pi_ref = mu_old, so r_d = 1: the "bypass" reference of PPO-clip / train_infer.
    return batch.logp_mu


def _current(actor: "MegatronActor", batch: TrainBatch, logp_theta: torch.Tensor) -> torch.Tensor:
    # The weights the batch meets, before this step's update. train_step takes one optimizer step
    # per batch, so those are exactly the weights of the gradient forward: its detached output is
    # bit-identical to an extra no-grad forward (tested) and saves that forward.
    return logp_theta.detach()


def _interpolated(actor: "MegatronActor", batch: TrainBatch, logp_theta: torch.Tensor) -> torch.Tensor:
    # linear / loglinear: mix mu_old and pi_theta by each token's version gap; the formula lives in
    # the correction package, the actor only supplies the gaps' inputs.
    from asyncrl.trainer.correction.reference import reference_logp

    return reference_logp(
        actor.reference,
        logp_mu=batch.logp_mu,
        logp_theta=logp_theta.detach(),
        versions=batch.versions,
        actor_version=actor.version,
        loss_mask=batch.loss_mask,
        max_staleness=actor.settings.max_staleness,
    ).detach()


def _ewma(actor: "MegatronActor", batch: TrainBatch) -> torch.Tensor:
    return actor.ewma_logprobs(batch.tokens)


def _exact(actor: "MegatronActor", batch: TrainBatch) -> torch.Tensor:
    if batch.logp_ref is None:
        raise ValueError(
            "correction.reference is 'exact' but the batch has no logp_ref; the old-logit strategy "
            "(oldLogits.strategy) must fill TrainBatch.logp_ref before train_step"
        )
    return batch.logp_ref.detach()


REFERENCES: dict[ReferencePolicy, ReferenceRule] = {
    ReferencePolicy.BEHAVIOR: ReferenceRule(after=_behavior),
    ReferencePolicy.CURRENT: ReferenceRule(after=_current),
    ReferencePolicy.LINEAR: ReferenceRule(after=_interpolated),
    ReferencePolicy.LOGLINEAR: ReferenceRule(after=_interpolated),
    ReferencePolicy.EWMA: ReferenceRule(before=_ewma, extra_forward=True),
    ReferencePolicy.EXACT: ReferenceRule(before=_exact),
}


def reference_rule(reference: ReferencePolicy | str) -> ReferenceRule:
    """The rule of ``reference``; an unknown key names the valid ones."""
    try:
        return REFERENCES[ReferencePolicy(reference)]
    except (ValueError, KeyError):
        valid = ", ".join(r.value for r in REFERENCES)
        raise ValueError(
            f"correction.reference {reference!r} is unknown; valid references: {valid}"
        ) from None
