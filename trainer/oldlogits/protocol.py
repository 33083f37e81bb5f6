"""The contract of the old-logit stage (docs/architecture.md, the path of one token: batch -> OldLogitProvider -> ``logp_ref``).

Three roles, kept apart:

- the **batch** a provider reads (:class:`PaddedBatch`): the actor's ``TrainBatch``
  (``trainer/actor/batch.py``) seen through the fields a provider reads, so that this package stays below the
  actor;

- the **actor** runs forwards (:class:`Scorer`): it owns the live weights and the model code;
- a **provider** (:class:`OldLogitProvider`) decides which weights score which tokens, owns the
  state that needs (EWMA weights, the snapshot store) and checkpoints it. It talks to the actor
  only through :class:`Scorer`, never through the actor's private attributes.

The loss stays pure: it receives the ``logp_ref`` a provider returned.

One train step (one batch, one version, ``epochs x minibatches`` optimizer updates) calls a provider
in this order (:meth:`MegatronActor.train_step`):

1. when the batch arrives, before any update: ``scored = provider.score(batch, scorer)``, the
   provider's own no-grad forwards (functional calls over the stored tensors: the live weights are
   never written, so they may run anywhere); the actor may call it on consecutive row ranges of the
   batch (micro-batches) and concatenate, so ``score`` must treat rows independently;
2. ``logp_ref = provider.logp_ref(batch, logp_theta, actor_version, scored)``, detached, with the
   ``logp_theta`` of the arrival weights; held fixed across every update of the batch. With a single
   update the actor may call it per micro-batch (row subsets of ``batch`` and ``scored``) with the
   gradient forward's output, which runs under those same weights: ``logp_ref`` must treat rows
   independently too. Providers that read ``logp_theta`` are listed in ``registry.READS_THETA``;
3. the updates (gradient forwards, loss, optimizer steps) never call the provider;
4. after the step, a provider that holds weight versions (:class:`VersionRetention`) keeps only the
   live versions the driver passed (plus the new one): ``provider.retain(live)``;
5. once per new version (at least one update applied): ``provider.observe_update(batch, scorer,
   keep_ratio)``, ``keep_ratio`` being the batch's share of valid tokens with ``r_d`` inside
   ``mask.bounds`` whatever ``mask.mode`` (the snapshot provider records the new version here:
   rollout receives it now).
"""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from asyncrl.api.correction import ReferencePolicy


class PaddedBatch(Protocol):
    """What a provider reads of a batch: ``[B, T]`` tensors aligned per token, right-padded.

    The actor's :class:`~asyncrl.trainer.actor.batch.TrainBatch` is the one implementation (its docstring says
    what every field holds); providers read it, never build one.
    """

    @property
    def tokens(self) -> Tensor: ...

    @property
    def loss_mask(self) -> Tensor: ...

    @property
    def logp_mu(self) -> Tensor: ...

    @property
    def versions(self) -> Tensor: ...

    @property
    def advantages(self) -> Tensor: ...

    @property
    def turn_ids(self) -> Tensor: ...

    @property
    def logp_old(self) -> Tensor | None: ...

    @property
    def routes(self) -> Tensor | None: ...  # [B, T, L, k] MoE routes to replay (routing replay), or None

    @property
    def route_slots(self) -> Tensor | None: ...  # [B, S, T, L, k] each row's routes per version

    @property
    def route_slot_versions(self) -> Tensor | None: ...  # [B, S] the version of each slot (-1: empty)


class Scorer(Protocol):
    """What the actor offers a provider: its version, its live weights and its forwards."""

    @property
    def version(self) -> int:
        """The version of the live weights (the one the batch meets)."""
        ...

    def named_weights(self) -> Mapping[str, Tensor]:
        """The live trainable parameters by name; read them, never write them."""
        ...

    def logprobs(self, tokens: Tensor, *, routes: Tensor | None = None) -> Tensor:
        """No-grad log-probs ``[b, T]`` of ``tokens`` ``[b, T]`` under the live weights (``routes``
        ``[b, T, L, k]``: MoE routes to replay, routing replay)."""
        ...

    def logprobs_under(self, weights: Mapping[str, Tensor], tokens: Tensor, routes: Tensor | None = None) -> Tensor:
        """No-grad log-probs ``[b, T]`` of ``tokens`` ``[b, T]`` under ``weights`` (same names and
        shapes as :meth:`named_weights`); the live weights are never written (a functional call);
        ``routes`` ``[b, T, L, k]``: MoE routes to replay."""
        ...


@runtime_checkable
class VersionBankScorer(Protocol):
    """A scorer that can run rows under different versions in one forward (LoRA: each row picks its version's
    adapter, ``trainer/megatron/lora.py``'s adapter bank)."""

    @property
    def scores_versions_at_once(self) -> bool:
        """True when :meth:`logprobs_under_each` serves this model (a dense LoRA actor)."""
        ...

    def logprobs_under_each(self, versions: Sequence[Mapping[str, Tensor]], tokens: Tensor, slot: Tensor) -> Tensor:
        """No-grad log-probs ``[n, T]`` of ``tokens`` ``[n, T]``, row ``i`` under ``versions[slot[i]]``."""
        ...


class OldLogitProvider(Protocol):
    """Produces ``logp_ref`` ``[B, T]`` for one reference (and, for ``exact``, one strategy)."""

    reference: ReferencePolicy  # what every metric and log says produced pi_ref (docs/architecture.md, the path of one token)
    extra_forward: bool  # costs at least one no-grad forward of the actor model per step

    def score(self, batch: PaddedBatch, scorer: Scorer) -> Tensor | None:
        """This provider's forwards before the gradient forward: ``[B, T]`` log-probs, or None."""
        ...

    def logp_ref(
        self, batch: PaddedBatch, logp_theta: Tensor, actor_version: int, scored: Tensor | None
    ) -> Tensor:
        """Detached ``logp_ref`` ``[B, T]`` from the batch, ``logp_theta`` ``[B, T]`` and ``scored``."""
        ...

    def observe_update(self, batch: PaddedBatch, scorer: Scorer, keep_ratio: float) -> str:
        """Once per new version (``scorer.version`` already advanced by one, after all the batch's
        updates): fold the new weights into the provider's state; ``keep_ratio``: the batch's in-bounds
        ratio of ``r_d`` (step 5 above); returns why the reference was reset ("" when it was not)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything the provider needs to continue after a resume."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        ...


class NoScoringNoState:
    """The provider methods of a reference computed from what the step already has: no forward of its
    own before the gradient forward, nothing folded in per version, nothing to checkpoint (closed-form,
    current, pre-scored exact)."""

    def score(self, batch: PaddedBatch, scorer: Scorer) -> Tensor | None:
        return None

    def observe_update(self, batch: PaddedBatch, scorer: Scorer, keep_ratio: float) -> str:
        return ""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


@dataclass(frozen=True)
class ResidentVersions:
    """What a version store holds now: how many weight versions and their bytes (memory or disk).

    ``shared_bytes``: of ``nbytes``, what this rank maps from the copy another data-parallel rank of its
    node wrote (:mod:`.node_share`); the node holds the sum over its ranks of ``nbytes - shared_bytes``."""

    versions: int
    nbytes: int
    shared_bytes: int = 0


@runtime_checkable
class VersionRetention(Protocol):
    """A provider (or the audit) that keeps weight versions: the driver's live set governs them.

    Providers without weight versions (closed-form, current, ewma, precomputed) do not implement it;
    for them retention is a no-op (:func:`retain_versions`).
    """

    def retain(self, versions: Collection[int]) -> None:
        """Keep exactly the resident versions in ``versions``; release every other one at once."""
        ...

    def resident(self) -> ResidentVersions:
        ...

    def close(self) -> None:
        """Release every version (and any file behind it)."""
        ...


def retain_versions(holder: object, versions: Collection[int]) -> None:
    """``holder.retain(versions)`` when it keeps weight versions; a no-op otherwise."""
    if isinstance(holder, VersionRetention):
        holder.retain(versions)
