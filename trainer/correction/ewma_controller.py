"""The PPO-EWMA reference controller: a bias-corrected parameter EWMA ``theta_prox`` (paper §5.2).

Update rule (openai/ppo-ewma ``ppo_ewma/ppg.py::EwmaModel``): the total weight starts at 1 when
``theta_prox`` is set to the current weights; after each policy version::

    new_total = beta * total + 1
    theta_prox <- (beta * total / new_total) * theta_prox + theta / new_total
    total <- new_total

so that with a constant ``beta``, ``theta_prox^(t) = sum_k beta^(t-k) theta^(k) / sum_k beta^(t-k)``
(paper §5.2, the bias-corrected weighted average). A reset is the update with ``beta = 0``:
``theta_prox = theta``, ``total = 1``.

Update point: once per **policy version** (after all ``epochs x minibatches`` optimizer updates of a
batch, :meth:`asyncrl.trainer.actor.megatron_actor.MegatronActor.train_step`), not per optimizer update. Why:

1. ``theta_prox`` stands in for the policies that *sampled* the tokens, and only versions sample
   (rollout never sees the weights between the updates of one batch);
2. the version gap of a token and ``async.maxStaleness`` count versions, so the centre of mass below
   is in the same unit as the gap it must match; updating per optimizer update with ``u`` updates
   per version would put it ``u`` times too close to ``theta`` (measured: ``docs/update-step.md``);
3. the reference is held fixed while a batch trains (read once, at arrival), so intermediate states
   would never be read anyway, and the reset statistic is one per batch.

Decay: a number in (0, 1), or ``auto = g / (g + 1)``: the EWMA's centre of mass
``beta / (1 - beta)`` then sits at ``g`` versions back, the expected version gap of a trained token.
``window: configured``: ``g = W / 2`` (gaps spread over ``0..W``, ``W = async.maxStaleness``), i.e.
``beta = W / (W + 2)`` (paper Appendix B). ``window: measured``: ``g`` = the mean version gap of the
trained tokens with a forgetting window (:meth:`EwmaController.observe_staleness`: a bias-corrected
average of the per-batch mean gaps with weight ``GAP_MEMORY ** age``, centre of mass about 20
batches back, so it follows a run whose staleness changes); ``W / 2`` until a first observation.

Reset rule (paper §6.5): when the batch's keep ratio of the mask bounds -- the share of valid tokens
whose ``r_d = pi_prox / mu`` lies inside ``mask.bounds``, computed the same whatever ``mask.mode``
(under ``truncate`` and ``none`` nothing is rejected, but ``theta_prox`` drifting away still shows
here) -- stays below ``tau`` for ``k`` consecutive versions, ``theta_prox`` is reset to the current
weights (reason ``keep_ratio_collapse``); :meth:`EwmaController.reset` does it on demand (``manual``).
That is ``reset.rule: paper``; ``paperCooldown`` adds a W-version cooldown and ``recentre`` an adaptive
threshold and a reset to the average of the weights that sampled the batch's tokens
(:mod:`asyncrl.trainer.correction.ewma_reset`, which also decides whether each reset recovered); the
weights it averages are rebuilt from bfloat16 residuals of this EWMA (:mod:`asyncrl.trainer.correction.ewma_history`:
``W / 2`` fp32 copies' worth, not ``W + 2`` copies).

Parameters are kept in fp32 whatever the model's dtype; only floating-point tensors are
averaged, others (integer buffers) follow the current value.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from asyncrl.api.correction import EwmaSpec
from asyncrl.trainer.correction.ewma_history import ResidualHistory
from asyncrl.trainer.correction.ewma_reset import Outcome, ResetRule, Rule, next_batch_versions

ResetReason = Literal["keep_ratio_collapse", "manual"]
# Forgetting factor of the measured gap: weight GAP_MEMORY**age per batch, centre of mass
# GAP_MEMORY / (1 - GAP_MEMORY) = 19 batches back (about the last 20 batches).
GAP_MEMORY = 0.95
# A module (its state_dict), a name -> tensor mapping, or a parameter list (keys "0", "1", ...).
Params = Mapping[str, Tensor] | nn.Module | Sequence[Tensor]


@dataclass(frozen=True)
class EwmaStepReport:
    """What one :meth:`EwmaController.update` did.

    ``streak``: consecutive low-keep-ratio steps up to and including this one (on a reset step it
    equals ``k``; the counter then restarts from 0). ``decay``: the ``beta`` used by this step
    (0 on a reset). ``total_weight``: the bias-correction total after the step.
    """

    reset: bool
    reason: ResetReason | None
    streak: int
    decay: float
    total_weight: float
    step: int
    threshold: float = float("nan")  # the in-bounds threshold this step was compared with (nan: none yet)
    outcomes: tuple[Outcome, ...] = ()  # earlier resets whose W-version outcome was decided at this step


def _as_dict(params: Params) -> dict[str, Tensor]:
    if isinstance(params, nn.Module):
        return dict(params.state_dict(keep_vars=False))
    if isinstance(params, Mapping):
        return dict(params)
    return {str(i): p for i, p in enumerate(params)}


class EwmaController:
    """Keeps ``theta_prox`` and decides its resets. Use ``from_spec``, ``init``, then ``update``
    after every policy version."""

    def __init__(
        self,
        *,
        decay: float | Literal["auto"],
        max_staleness: int,
        window: Literal["configured", "measured"] = "configured",
        reset_enabled: bool = True,
        keep_ratio_below: float = 0.8,
        consecutive_steps: int = 3,
        rule: Rule = "paper",
        margin: float = 0.1,
    ) -> None:
        if decay != "auto" and not 0.0 <= float(decay) < 1.0:
            raise ValueError(f"decay must be 'auto' or in [0, 1); got {decay!r}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness (W) must be >= 0; got {max_staleness}")
        if window not in ("configured", "measured"):
            raise ValueError(f"window must be 'configured' or 'measured'; got {window!r}")
        if consecutive_steps < 1:
            raise ValueError(f"consecutive_steps (k) must be >= 1; got {consecutive_steps}")
        self.decay_setting = decay
        self.max_staleness = max_staleness
        self.window = window
        self.reset_enabled = reset_enabled
        self.keep_ratio_below = keep_ratio_below
        self.consecutive_steps = consecutive_steps
        self.rule = ResetRule(rule=rule, keep_ratio_below=keep_ratio_below, consecutive_steps=consecutive_steps,
                              window=max_staleness, margin=margin, enabled=reset_enabled)
        self.params: dict[str, Tensor] = {}
        # recentre: the last W versions' EWMA residuals (bf16), to rebuild their weights; None for the other rules
        # and with the reset off (nothing would read them).
        self.history: ResidualHistory | None = (ResidualHistory(max_staleness) if rule == "recentre" and reset_enabled
                                                else None)
        self.version: int | None = None  # the policy version of the last weights seen
        self.total_weight = 1.0
        self.step = 0
        self.resets = 0
        self.last_reset_reason: ResetReason | None = None
        # Bias-corrected forgetting average of the per-batch mean gaps: sum GAP_MEMORY**age * gap and
        # sum GAP_MEMORY**age (0 before the first observation).
        self._gap_sum = 0.0
        self._gap_weight = 0.0

    @classmethod
    def from_spec(cls, spec: EwmaSpec, *, max_staleness: int) -> "EwmaController":
        """From ``spec.correction.ewma`` and ``W = spec.async.maxStaleness`` (decay omitted: auto)."""
        return cls(
            decay="auto" if spec.decay is None else spec.decay,
            max_staleness=max_staleness,
            window=spec.window,
            reset_enabled=spec.reset.enabled,
            keep_ratio_below=spec.reset.keep_ratio_below,
            consecutive_steps=spec.reset.consecutive_steps,
            rule=spec.reset.rule,
            margin=spec.reset.margin,
        )

    @property
    def streak(self) -> int:
        """Consecutive low versions so far (the reset rule's counter)."""
        return self.rule.streak

    # --- decay -----------------------------------------------------------------------------------
    @property
    def expected_gap(self) -> float:
        """``g`` of ``decay: auto``: ``W / 2`` (configured, or measured before any observation), else the
        forgetting average of the measured per-batch mean gaps."""
        if self.window == "measured" and self._gap_weight > 0.0:
            return self._gap_sum / self._gap_weight
        return self.max_staleness / 2.0

    @property
    def decay(self) -> float:
        """The current ``beta``: the fixed value, or ``g / (g + 1)`` (centre of mass ``g`` versions back)."""
        if self.decay_setting == "auto":
            g = self.expected_gap
            return g / (g + 1.0)
        return float(self.decay_setting)

    def observe_staleness(self, mean_gap: float | Tensor) -> None:
        """Feed the mean version gap of the trained tokens of one batch (window ``measured``); older
        batches fade by ``GAP_MEMORY`` per batch."""
        gap = float(mean_gap)
        if not gap >= 0.0:  # also rejects NaN
            raise ValueError(f"mean staleness must be a number >= 0; got {gap}")
        self._gap_sum = GAP_MEMORY * self._gap_sum + gap
        self._gap_weight = GAP_MEMORY * self._gap_weight + 1.0

    # --- parameters ------------------------------------------------------------------------------
    def init(self, params: Params, version: int | None = None) -> None:
        """Set ``theta_prox`` to a fp32 copy of ``params`` (total weight 1); ``version``: their policy
        version (kept for the recentre rule)."""
        self.params = {k: self._copy(v) for k, v in _as_dict(params).items()}
        self.total_weight = 1.0
        self.version = None if version is None else int(version)
        self._started()

    def _started(self) -> None:
        """``theta_prox`` now equals the weights of ``self.version``: the recentre history starts there."""
        if self.history is not None:
            if self.version is None:
                self.history.clear()
            else:
                self.history.start(self.version)

    @staticmethod
    def _copy(v: Tensor) -> Tensor:
        v = v.detach()
        return v.to(torch.float32, copy=True) if v.is_floating_point() else v.clone()

    def _check_keys(self, current: Mapping[str, Tensor]) -> None:
        if not self.params:
            raise RuntimeError("EwmaController.init(params) must be called before update/reset")
        missing, extra = sorted(set(self.params) - set(current)), sorted(set(current) - set(self.params))
        bad = [k for k in self.params if k in current and self.params[k].shape != current[k].shape]
        if missing or extra or bad:
            shapes = [f"{k}: {tuple(self.params[k].shape)} vs {tuple(current[k].shape)}" for k in bad]
            raise ValueError(f"parameters do not match theta_prox: missing {missing}, unexpected {extra}, shapes {shapes}")

    @torch.no_grad()
    def _blend(self, current: Mapping[str, Tensor], beta: float) -> None:
        new_total = beta * self.total_weight + 1.0
        keep = beta * self.total_weight / new_total
        for k, p_ewma in self.params.items():
            p = current[k].detach()
            if p_ewma.is_floating_point():
                p_ewma.mul_(keep).add_(p.to(device=p_ewma.device, dtype=torch.float32), alpha=1.0 / new_total)
            else:
                p_ewma.copy_(p)
        self.total_weight = new_total

    def reset(self, params: Params, reason: ResetReason = "manual") -> EwmaStepReport:
        """``theta_prox <- params`` (the update with ``beta = 0``); counts and reports the reset."""
        current = _as_dict(params)
        self._check_keys(current)
        streak = self.rule.streak
        if reason == "manual":
            self.rule.fired(self.rule.threshold())
        self._blend(current, 0.0)
        if self.history is not None:
            # ``params`` need not be any version's weights (a manual reset comes between versions); the cooldown
            # keeps the next reset W + k versions away, so it never needs the versions before this one.
            self.history.clear()
        self.resets += 1
        self.last_reset_reason = reason
        return EwmaStepReport(True, reason, streak, 0.0, self.total_weight, self.step, self.rule.threshold())

    @torch.no_grad()
    def _recentre(self, current: Mapping[str, Tensor], token_versions: Mapping[int, int] | None,
                  version: int | None) -> bool:
        """theta_prox <- the token-weighted average of the sampling versions' weights (one version
        younger), total weight at its steady state; False (nothing done) when none of them is held."""
        if token_versions is None or version is None or self.history is None:
            return False
        if not self.history.centroid_into(self.params, current, next_batch_versions(token_versions, int(version)),
                                          int(version)):
            return False
        # theta_prox is no version's weights now; the cooldown keeps the next reset W + k versions away, so
        # it only averages versions recorded after this one.
        self.history.clear()
        beta = self.decay
        self.total_weight = 1.0 / (1.0 - beta)
        return True

    def update(self, params: Params, keep_ratio: float | Tensor | None = None, *, version: int | None = None,
               token_versions: Mapping[int, int] | None = None) -> EwmaStepReport:
        """One step after a policy version: reset if the reset rule fires, else EWMA-update.

        Args:
            params: the current weights (module or name -> tensor).
            keep_ratio: the batch's keep ratio of the mask bounds (share of valid tokens with ``r_d``
                inside ``mask.bounds``, whatever ``mask.mode``; see the module docstring). None: not
                observed, the streak is left as it is. A 0-dim tensor is read here (one host sync).
            version: the policy version of ``params`` (the recentre rule keeps the recent ones).
            token_versions: the batch's valid-token count per sampling version (the recentre target);
                without it (or with none of its versions held) a recentre reset falls back to the current
                weights.
        """
        current = _as_dict(params)
        self._check_keys(current)
        self.step += 1
        self.version = None if version is None else int(version)
        decided = self.rule.observe(None if keep_ratio is None else float(keep_ratio))
        if decided.fire:
            reason: ResetReason = "keep_ratio_collapse"
            if self.rule.rule == "recentre" and self._recentre(current, token_versions, version):
                self.resets += 1
                self.last_reset_reason = reason
                return EwmaStepReport(True, reason, decided.streak, 0.0, self.total_weight, self.step,
                                      decided.threshold, decided.outcomes)
            self._blend(current, 0.0)
            self._started()
            self.resets += 1
            self.last_reset_reason = reason
            return EwmaStepReport(True, reason, decided.streak, 0.0, self.total_weight, self.step,
                                  decided.threshold, decided.outcomes)
        beta = self.decay
        if self.history is not None:
            if version is None:
                self.history.clear()
            else:
                self.history.record(int(version), current, self.params, beta * self.total_weight + 1.0)
        self._blend(current, beta)
        return EwmaStepReport(False, None, decided.streak, beta, self.total_weight, self.step, decided.threshold,
                              decided.outcomes)

    def load_into(self, module: nn.Module) -> None:
        """Copy ``theta_prox`` into ``module`` (cast to each parameter's dtype), e.g. the reference
        model whose forward gives ``logp_ref``."""
        module.load_state_dict({k: v for k, v in self.params.items()}, strict=True)

    # --- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "params": {k: v.clone() for k, v in self.params.items()},
            "total_weight": self.total_weight,
            "streak": self.streak,
            "rule": self.rule.state_dict(),
            "residuals": None if self.history is None else self.history.state_dict(),
            "version": self.version,
            "step": self.step,
            "resets": self.resets,
            "last_reset_reason": self.last_reset_reason,
            "gap_sum": self._gap_sum,
            "gap_weight": self._gap_weight,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.params = {k: v.clone() for k, v in state["params"].items()}
        self.total_weight = float(state["total_weight"])
        if "rule" in state:
            self.rule.load_state_dict(state["rule"])
        else:  # written before the reset rules: the paper's counter only
            self.rule.streak = int(state["streak"])
        self.version = None if state.get("version") is None else int(state["version"])
        if self.history is not None:
            # A checkpoint from before the residuals ("history": fp32 copies) or of another rule has none: the
            # first W versions after the resume then average only the versions seen since (and the live ones).
            self.history.clear()
            if state.get("residuals") is not None:
                self.history.load_state_dict(state["residuals"])
        self.step = int(state["step"])
        self.resets = int(state["resets"])
        self.last_reset_reason = state["last_reset_reason"]
        if "gap_sum" in state:
            self._gap_sum, self._gap_weight = float(state["gap_sum"]), float(state["gap_weight"])
        else:  # written before the forgetting window: the whole-run mean, as one observation
            count = int(state["staleness_count"])
            self._gap_sum = float(state["staleness_sum"]) / count if count else 0.0
            self._gap_weight = 1.0 if count else 0.0
