"""Reference policies in closed form: ``behavior``, ``linear``, ``loglinear`` (paper §4.2, Appendix A).

No forward pass: ``logp_ref`` is a function of ``logp_mu``, the detached ``logp_theta``, the token
versions and the actor version. Behaviour weight ``alpha = 1 / (n + 1)`` for a token of version gap
``n = actor_version - token_version``::

    behavior:   log pi_ref = logp_mu                     (so r_d = 1; PPO-clip on pi_theta / mu, "bypass")
    loglinear:  log pi_ref = alpha * logp_mu + (1 - alpha) * logp_theta
    linear:     log pi_ref = log(alpha * mu + (1 - alpha) * pi_theta)
                           = logaddexp(log(alpha) + logp_mu, log1p(-alpha) + logp_theta)

``logp_theta`` is detached (as in AReaL's ``compute_prox_logp_approximations``): the reference is a
constant of the update, so the clip only re-parameterizes its bounds (Proposition 1,
:mod:`asyncrl.trainer.thresholds`). Gap 0 gives ``logp_mu`` exactly (``alpha = 1``). Tokens that do
not count (no version, ``versions < 0``: prompt or environment tokens; or ``loss_mask`` False) get
``logp_mu`` too, so their ratios are neutral.

Note the coefficient convention: ``alpha`` weighs *mu* here (paper), while AReaL's ``alpha`` weighs
``pi_theta``.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.api.correction import ReferencePolicy
from asyncrl.trainer.oldlogits.protocol import NoScoringNoState, PaddedBatch


def version_gaps(
    versions: Tensor,
    actor_version: int | Tensor,
    *,
    loss_mask: Tensor | None = None,
    max_staleness: int | None = None,
) -> Tensor:
    """``n = actor_version - version`` per token ``[B, T]`` (int64); ``-1`` for tokens that do not
    count: no version (``versions < 0``: prompt/environment tokens) or ``loss_mask`` False.

    Raises ``ValueError`` if a counted token is newer than the actor, or older than
    ``max_staleness`` allows (the staleness buffer must have dropped it): both are data bugs.
    Reading the checks is one host sync (this runs before the loss, not inside it).
    """
    gaps = torch.as_tensor(actor_version, device=versions.device) - versions.long()  # [B, T]
    counted = versions >= 0
    if loss_mask is not None:
        counted = counted & loss_mask
    too_new = counted & (gaps < 0)
    too_old = counted & (gaps > max_staleness) if max_staleness is not None else torch.zeros_like(counted)
    if bool((too_new | too_old).any()):
        lo, hi = int(gaps[counted].min()), int(gaps[counted].max())
        raise ValueError(
            f"version gaps of counted tokens span [{lo}, {hi}] at actor_version={int(actor_version)}; "
            f"they must lie in [0, {max_staleness if max_staleness is not None else 'inf'}] "
            "(a token newer than the actor, or staler than async.maxStaleness, is a data bug)"
        )
    return torch.where(counted, gaps, -1)


def behaviour_weight(gaps: Tensor, dtype: torch.dtype) -> Tensor:
    """``alpha = 1 / (n + 1)`` per token ``[B, T]``; 1 where the token has no version (``n = -1``)."""
    return 1.0 / (gaps.clamp(min=0) + 1).to(dtype)


def _interp_inputs(
    logp_mu: Tensor | None,
    logp_theta: Tensor | None,
    versions: Tensor | None,
    actor_version: int | Tensor | None,
    loss_mask: Tensor | None,
    max_staleness: int | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    if logp_mu is None or logp_theta is None or versions is None or actor_version is None:
        raise ValueError("linear/loglinear references need logp_mu, logp_theta, versions and actor_version")
    if not (logp_mu.shape == logp_theta.shape == versions.shape) or logp_mu.dim() != 2:
        raise ValueError(
            f"logp_mu {tuple(logp_mu.shape)}, logp_theta {tuple(logp_theta.shape)} and versions "
            f"{tuple(versions.shape)} must all be [B, T]"
        )
    dtype = torch.promote_types(logp_theta.dtype, torch.float32)
    gaps = version_gaps(versions, actor_version, loss_mask=loss_mask, max_staleness=max_staleness)
    mu = logp_mu.detach().to(dtype)
    theta = logp_theta.detach().to(dtype)
    return mu, theta, behaviour_weight(gaps, dtype), gaps > 0


def loglinear_reference(
    *, logp_mu: Tensor | None = None, logp_theta: Tensor | None = None,
    versions: Tensor | None = None, actor_version: int | Tensor | None = None,
    loss_mask: Tensor | None = None, max_staleness: int | None = None,
) -> Tensor:
    """``alpha * logp_mu + (1 - alpha) * logp_theta.detach()`` per token; ``logp_mu`` where gap <= 0."""
    mu, theta, alpha, stale = _interp_inputs(
        logp_mu, logp_theta, versions, actor_version, loss_mask, max_staleness
    )
    # where, not arithmetic: at gap 0 the result is mu exactly, even if logp_theta is -inf there.
    return torch.where(stale, alpha * mu + (1.0 - alpha) * theta, mu)


def linear_reference(
    *, logp_mu: Tensor | None = None, logp_theta: Tensor | None = None,
    versions: Tensor | None = None, actor_version: int | Tensor | None = None,
    loss_mask: Tensor | None = None, max_staleness: int | None = None,
) -> Tensor:
    """``log(alpha * mu + (1 - alpha) * pi_theta)`` per token via ``logaddexp`` (no exp of log-probs)."""
    mu, theta, alpha, stale = _interp_inputs(
        logp_mu, logp_theta, versions, actor_version, loss_mask, max_staleness
    )
    mixed = torch.logaddexp(alpha.log() + mu, torch.log1p(-alpha) + theta)
    return torch.where(stale, mixed, mu)


def behavior_reference(
    *, logp_mu: Tensor | None = None, logp_theta: Tensor | None = None,
    versions: Tensor | None = None, actor_version: int | Tensor | None = None,
    loss_mask: Tensor | None = None, max_staleness: int | None = None,
) -> Tensor:
    """``logp_mu`` itself (detached)."""
    if logp_mu is None:
        raise ValueError("reference 'behavior' needs logp_mu")
    return logp_mu.detach()


ClosedForm = Callable[..., Tensor]  # keyword-only (logp_mu, logp_theta, versions, actor_version, ...)


@dataclass
class ClosedFormProvider(NoScoringNoState):
    """A stateless provider whose ``logp_ref`` is ``formula`` of the batch and ``logp_theta``."""

    reference: ReferencePolicy
    formula: ClosedForm
    max_staleness: int | None = None  # W: a counted token with a larger gap raises (linear, loglinear)
    extra_forward: bool = False

    def logp_ref(
        self, batch: PaddedBatch, logp_theta: Tensor, actor_version: int, scored: Tensor | None
    ) -> Tensor:
        return self.formula(
            logp_mu=batch.logp_mu, logp_theta=logp_theta, versions=batch.versions,
            actor_version=actor_version, loss_mask=batch.loss_mask, max_staleness=self.max_staleness,
        )
