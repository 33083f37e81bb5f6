"""Where the actor gets ``logp_ref`` for each ``spec.correction.reference`` (ARCHITECTURE §1).

The formulas live in :func:`asyncrl.trainer.correction.references.reference_logp`; this registry
says what the *actor* must supply to it, and when. A rule's ``given`` function produces the
``logp_given`` of the forward-pass references, in one of two phases of a train step:

- ``before`` the gradient forward: ``ewma`` (its own no-grad forward with the EWMA weights
  swapped in; in-place weight swaps must happen before autograd saves any parameter for
  backward) and ``exact`` (the caller's ``TrainBatch.logp_ref``);
- ``after`` it: ``current`` (the detached ``logp_theta``, see :func:`_current`).

``behavior``, ``linear`` and ``loglinear`` need no forward: ``reference_logp`` builds them from
``logp_mu``, ``logp_theta``, the token versions and the actor version.
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
    """What the actor supplies as ``logp_given`` for one reference (at most one phase is set)."""

    before: BeforeFn | None = None
    after: AfterFn | None = None
    extra_forward: bool = False  # costs one no-grad forward of the actor model


def _current(actor: "MegatronActor", batch: TrainBatch, logp_theta: torch.Tensor) -> torch.Tensor:
    # The weights the batch meets, before this step's update. train_step takes one optimizer step
    # per batch, so those are exactly the weights of the gradient forward: its detached output is
    # bit-identical to an extra no-grad forward (tested) and saves that forward.
    return logp_theta.detach()


def _ewma(actor: "MegatronActor", batch: TrainBatch) -> torch.Tensor:
    return actor.ewma_logprobs(batch.tokens)


def _exact(actor: "MegatronActor", batch: TrainBatch) -> torch.Tensor:
    if batch.logp_ref is None and actor.snapshots is not None:
        return actor.snapshot_logprobs(batch)  # strategy snapshot: the actor keeps the versions
    if batch.logp_ref is None:
        raise ValueError(
            "correction.reference is 'exact' but the batch has no logp_ref; the old-logit strategy "
            "(oldLogits.strategy) must fill TrainBatch.logp_ref before train_step"
        )
    return batch.logp_ref


REFERENCES: dict[ReferencePolicy, ReferenceRule] = {
    ReferencePolicy.BEHAVIOR: ReferenceRule(),
    ReferencePolicy.CURRENT: ReferenceRule(after=_current),
    ReferencePolicy.LINEAR: ReferenceRule(),
    ReferencePolicy.LOGLINEAR: ReferenceRule(),
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
