"""The old-logit stage: where ``logp_ref`` (``pi_old`` or the reference standing in for it) comes from.

docs/architecture.md: notation, the path of one token, paper §4.2 and §5. One module per concept:

- :mod:`.protocol`: :class:`Scorer` (the actor's forwards) and :class:`OldLogitProvider`;
- :mod:`.closed_form`: ``behavior``, ``linear``, ``loglinear`` (no forward) and the version gaps;
- :mod:`.current`: ``current`` (the detached gradient forward);
- :mod:`.ewma`: ``ewma`` (``theta_prox`` and its controller);
- :mod:`.snapshot`: ``exact`` by weight snapshots (the snapshot store);
- :mod:`.precomputed`: ``exact`` scored before the batch arrives (dedicated, interruptSync);
- :mod:`.registry`: the one registry, :func:`make_provider`, :func:`reference_logp`.

Submodules import torch only; none imports the actor or the loss.
"""

from asyncrl.trainer.oldlogits.closed_form import ClosedFormProvider, version_gaps
from asyncrl.trainer.oldlogits.current import CurrentProvider
from asyncrl.trainer.oldlogits.ewma import EwmaProvider
from asyncrl.trainer.oldlogits.precomputed import PrecomputedProvider, UnscoredTokensError
from asyncrl.trainer.oldlogits.protocol import OldLogitProvider, Scorer
from asyncrl.trainer.oldlogits.registry import (
    PROVIDERS,
    ProviderSettings,
    make_provider,
    provider_key,
    reference_logp,
)
from asyncrl.trainer.oldlogits.snapshot import MissingSnapshotError, SnapshotProvider, WeightSnapshots

__all__ = [
    "PROVIDERS",
    "ClosedFormProvider",
    "CurrentProvider",
    "EwmaProvider",
    "MissingSnapshotError",
    "OldLogitProvider",
    "PrecomputedProvider",
    "ProviderSettings",
    "Scorer",
    "SnapshotProvider",
    "UnscoredTokensError",
    "WeightSnapshots",
    "make_provider",
    "provider_key",
    "reference_logp",
    "version_gaps",
]
