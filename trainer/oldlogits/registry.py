"""The one registry of old-logit providers: ``(correction.reference, oldLogits.strategy)`` -> provider.

Keys are the reference values, except ``exact``, whose key is its strategy (``snapshot``,
``dedicated``, ``interruptSync``): the strategy is what decides how ``pi_old`` is recovered.
``dedicated`` and ``interruptSync`` score tokens before the batch reaches the actor
(:mod:`.precomputed`); asking for an unknown key names the valid ones.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from asyncrl.api.correction import EwmaSpec, ReferencePolicy
from asyncrl.api.old_logits import OldLogitsSpec
from asyncrl.trainer.oldlogits.closed_form import (
    ClosedFormProvider,
    behavior_reference,
    linear_reference,
    loglinear_reference,
)
from asyncrl.trainer.oldlogits.current import CurrentProvider
from asyncrl.trainer.oldlogits.ewma import EwmaProvider
from asyncrl.trainer.oldlogits.precomputed import PrecomputedProvider
from asyncrl.trainer.oldlogits.protocol import OldLogitProvider
from asyncrl.trainer.oldlogits.snapshot import SnapshotProvider


@dataclass(frozen=True)
class ProviderSettings:
    """What the providers read from the job spec (adapted once by the actor's settings)."""

    max_staleness: int = 2  # W (async.maxStaleness)
    ewma: EwmaSpec = field(default_factory=EwmaSpec)  # correction.ewma
    old_logits: OldLogitsSpec = field(default_factory=OldLogitsSpec)  # oldLogits
    work_dir: str | None = None  # snapshot.device disk: the folder of the files (None: a private temp folder)

    @property
    def snapshot_capacity(self) -> int:
        """Hard cap on resident snapshot versions: ``oldLogits.snapshot.maxVersions``, 0 = ``W + 1``."""
        return self.old_logits.snapshot.max_versions or self.max_staleness + 1


ProviderFactory = Callable[[ProviderSettings], OldLogitProvider]


def _snapshot(s: ProviderSettings) -> OldLogitProvider:
    device = str(getattr(s.old_logits.snapshot.device, "value", s.old_logits.snapshot.device))
    if device not in ("cpu", "disk"):
        raise ValueError(f"oldLogits.snapshot.device {device!r} is not one of cpu, disk")
    return SnapshotProvider(s.snapshot_capacity, device="disk" if device == "disk" else "cpu", work_dir=s.work_dir)


PROVIDERS: dict[str, ProviderFactory] = {
    ReferencePolicy.BEHAVIOR.value: lambda s: ClosedFormProvider(ReferencePolicy.BEHAVIOR, behavior_reference),
    ReferencePolicy.CURRENT.value: lambda s: CurrentProvider(),
    ReferencePolicy.LINEAR.value: lambda s: ClosedFormProvider(
        ReferencePolicy.LINEAR, linear_reference, s.max_staleness
    ),
    ReferencePolicy.LOGLINEAR.value: lambda s: ClosedFormProvider(
        ReferencePolicy.LOGLINEAR, loglinear_reference, s.max_staleness
    ),
    ReferencePolicy.EWMA.value: lambda s: EwmaProvider(s.ewma, max_staleness=s.max_staleness),
    "snapshot": _snapshot,  # reference exact, oldLogits.strategy snapshot
    # reference exact, scored before the batch arrives (trainer/driver's old-logit stages)
    "dedicated": lambda s: PrecomputedProvider("dedicated"),
    "interruptSync": lambda s: PrecomputedProvider("interruptSync"),
}


# Providers whose ``logp_ref`` reads ``logp_theta`` (the reference of a batch is computed at its
# arrival, so with several updates the actor runs one no-grad forward for these; the others use
# their own forwards or the batch alone). An extra forward for a key missing here would only cost time.
READS_THETA: frozenset[str] = frozenset({
    ReferencePolicy.CURRENT.value, ReferencePolicy.LINEAR.value, ReferencePolicy.LOGLINEAR.value,
    "dedicated", "interruptSync",  # the actor's own-version tokens
})


def reads_logp_theta(reference: ReferencePolicy | str, old_logits: OldLogitsSpec | None = None) -> bool:
    """Whether the provider of ``reference`` (and strategy) reads ``logp_theta`` in ``logp_ref``."""
    return provider_key(reference, old_logits) in READS_THETA


def provider_key(reference: ReferencePolicy | str, old_logits: OldLogitsSpec | None = None) -> str:
    """The registry key of ``reference`` (for ``exact``: its ``oldLogits.strategy``)."""
    if reference != ReferencePolicy.EXACT:
        return str(getattr(reference, "value", reference))
    if old_logits is None or old_logits.strategy is None:
        raise ValueError(
            "correction.reference is 'exact' but oldLogits.strategy is not set; set oldLogits.strategy: "
            "snapshot (exact old logits from kept weight versions)"
        )
    return old_logits.strategy.value


def make_provider(
    reference: ReferencePolicy | str, settings: ProviderSettings | None = None
) -> OldLogitProvider:
    """The provider of ``reference`` with ``settings``; an unknown key names the valid ones."""
    settings = settings or ProviderSettings()
    key = provider_key(reference, settings.old_logits)
    try:
        factory = PROVIDERS[key]
    except KeyError:
        valid = ", ".join(PROVIDERS)
        what = f"oldLogits.strategy {key!r}" if reference == ReferencePolicy.EXACT else f"correction.reference {key!r}"
        raise ValueError(
            f"{what} has no old-logit provider; valid: {valid} (snapshot is correction.reference: exact "
            "with oldLogits.strategy: snapshot)"
        ) from None
    return factory(settings)


def reference_logp(
    kind: ReferencePolicy | str,
    *,
    logp_mu: Tensor,
    logp_theta: Tensor | None = None,
    versions: Tensor | None = None,
    actor_version: int | Tensor | None = None,
    loss_mask: Tensor | None = None,
    max_staleness: int | None = None,
) -> Tensor:
    """``logp_ref [B, T]`` of a closed-form reference (``behavior``, ``linear``, ``loglinear``).

    Args:
        kind: the reference; one computed by a forward pass (``current``, ``ewma``, ``exact``) raises.
        logp_mu: ``[B, T]`` behaviour log-probs.
        logp_theta: ``[B, T]`` current log-probs, detached inside (linear, loglinear).
        versions: ``[B, T]`` int version that generated each token, -1 for none.
        actor_version: the actor's current version (int or 0-dim tensor).
        loss_mask: ``[B, T]`` bool; tokens outside it get ``logp_mu`` and skip the gap checks.
        max_staleness: ``W``; a counted token with a larger gap raises (linear, loglinear).
    """
    provider = make_provider(kind, ProviderSettings(max_staleness=max_staleness or 0))
    if not isinstance(provider, ClosedFormProvider):
        closed = ", ".join(k for k, f in PROVIDERS.items() if isinstance(f(ProviderSettings()), ClosedFormProvider))
        raise ValueError(
            f"reference {provider.reference.value!r} is computed by a forward pass of the actor, not in closed "
            f"form; closed-form references: {closed}"
        )
    return provider.formula(
        logp_mu=logp_mu, logp_theta=logp_theta, versions=versions, actor_version=actor_version,
        loss_mask=loss_mask, max_staleness=max_staleness,
    )
