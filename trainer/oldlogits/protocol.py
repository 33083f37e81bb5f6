"""The contract of the old-logit stage (ARCHITECTURE §3: batch -> OldLogitProvider -> ``logp_ref``).

Two roles, kept apart:

- the **actor** runs forwards (:class:`Scorer`): it owns the live weights and the model code;
- a **provider** (:class:`OldLogitProvider`) decides which weights score which tokens, owns the
  state that needs (EWMA weights, the snapshot store) and checkpoints it. It talks to the actor
  only through :class:`Scorer`, never through the actor's private attributes.

The loss stays pure: it receives the ``logp_ref`` a provider returned.

One train step calls a provider in this order (:meth:`MegatronActor.train_step`):

1. ``scored = provider.score(batch, scorer)``: the provider's own no-grad forwards, *before* the
   gradient forward (a weight swap is an in-place copy, which must happen before autograd saves
   any parameter for backward);
2. the actor's gradient forward gives ``logp_theta``;
3. ``logp_ref = provider.logp_ref(batch, logp_theta, actor_version, scored)``, detached;
4. after an applied update only: ``provider.observe_update(batch, scorer, keep_ratio)``.
"""

from collections.abc import Mapping
from typing import Any, Protocol

from torch import Tensor

from asyncrl.api.correction import ReferencePolicy
from asyncrl.trainer.megatron.batch import TrainBatch


class Scorer(Protocol):
    """What the actor offers a provider: its version, its live weights and its forwards."""

    @property
    def version(self) -> int:
        """The version of the live weights (the one the batch meets)."""
        ...

    def named_weights(self) -> Mapping[str, Tensor]:
        """The live trainable parameters by name; read them, never write them."""
        ...

    def logprobs(self, tokens: Tensor) -> Tensor:
        """No-grad log-probs ``[b, T]`` of ``tokens`` ``[b, T]`` under the live weights."""
        ...

    def logprobs_under(self, weights: Mapping[str, Tensor], tokens: Tensor) -> Tensor:
        """No-grad log-probs ``[b, T]`` of ``tokens`` ``[b, T]`` under ``weights`` (same names and
        shapes as :meth:`named_weights`); the live weights are unchanged afterwards."""
        ...


class OldLogitProvider(Protocol):
    """Produces ``logp_ref`` ``[B, T]`` for one reference (and, for ``exact``, one strategy)."""

    reference: ReferencePolicy  # what every metric and log says produced pi_ref (ARCHITECTURE §5)
    extra_forward: bool  # costs at least one no-grad forward of the actor model per step

    def score(self, batch: TrainBatch, scorer: Scorer) -> Tensor | None:
        """This provider's forwards before the gradient forward: ``[B, T]`` log-probs, or None."""
        ...

    def logp_ref(
        self, batch: TrainBatch, logp_theta: Tensor, actor_version: int, scored: Tensor | None
    ) -> Tensor:
        """Detached ``logp_ref`` ``[B, T]`` from the batch, ``logp_theta`` ``[B, T]`` and ``scored``."""
        ...

    def observe_update(self, batch: TrainBatch, scorer: Scorer, keep_ratio: float) -> str:
        """After an applied update (``scorer.version`` already advanced): fold the new weights into
        the provider's state; returns why the reference was reset this step ("" when it was not)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything the provider needs to continue after a resume."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        ...
