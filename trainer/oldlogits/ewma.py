"""The ``ewma`` reference (PPO-EWMA, paper §5.2): a parameter EWMA ``theta_prox`` scored by the actor.

Cost: one weight copy (``theta_prox``, kept here) and one no-grad forward per batch (at its arrival;
the result is held across the batch's minibatches and epochs). ``theta_prox`` folds in the weights
once per version, after all the batch's updates (the controller's module docstring says why). The EWMA math
(decay, bias correction, resets) is :class:`asyncrl.trainer.correction.ewma.EwmaController`; this
provider owns the controller, starts it from the weights RL starts with, feeds it every update and
checkpoints it.
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from asyncrl.api.correction import EwmaSpec, ReferencePolicy
from asyncrl.trainer.megatron.batch import TrainBatch
from asyncrl.trainer.oldlogits.protocol import Scorer

if TYPE_CHECKING:
    from asyncrl.trainer.correction.ewma import EwmaController


class EwmaProvider:
    """``logp_ref`` = the actor's forward under ``theta_prox``."""

    reference = ReferencePolicy.EWMA
    extra_forward = True

    def __init__(self, spec: EwmaSpec, *, max_staleness: int) -> None:
        self.spec = spec
        self.max_staleness = max_staleness
        # Created on first use from the live weights, so supervised warm-start steps are not averaged in.
        self.controller: EwmaController | None = None

    def _ensure(self, scorer: Scorer) -> "EwmaController":
        if self.controller is None:
            # Imported here: asyncrl.trainer.correction re-exports names of this package (no cycle).
            from asyncrl.trainer.correction.ewma import EwmaController

            self.controller = EwmaController.from_spec(self.spec, max_staleness=self.max_staleness)
            self.controller.init(scorer.named_weights())
        return self.controller

    def score(self, batch: TrainBatch, scorer: Scorer) -> Tensor | None:
        return scorer.logprobs_under(self._ensure(scorer).params, batch.tokens)

    def logp_ref(
        self, batch: TrainBatch, logp_theta: Tensor, actor_version: int, scored: Tensor | None
    ) -> Tensor:
        if scored is None:
            raise ValueError("the ewma reference needs its forward: call score() before logp_ref()")
        return scored.detach()

    def observe_update(self, batch: TrainBatch, scorer: Scorer, keep_ratio: float) -> str:
        """Fold the new version's weights into ``theta_prox`` and the batch's mean staleness into the
        measured window; ``keep_ratio``: the batch's in-bounds ratio of ``r_d`` (the reset statistic);
        the reset reason, or "" when none."""
        ewma = self._ensure(scorer)
        # One version per batch: the batch met scorer.version - 1, whatever the number of updates.
        gaps = (scorer.version - 1 - batch.versions)[batch.loss_mask]
        if gaps.numel():
            ewma.observe_staleness(gaps.float().mean())
        report = ewma.update(scorer.named_weights(), keep_ratio)
        return str(report.reason) if report.reset else ""

    def state_dict(self) -> dict[str, Any]:
        return {"ewma": self.controller.state_dict() if self.controller is not None else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["ewma"] is None:
            self.controller = None
            return
        from asyncrl.trainer.correction.ewma import EwmaController

        self.controller = EwmaController.from_spec(self.spec, max_staleness=self.max_staleness)
        self.controller.load_state_dict(state["ewma"])
