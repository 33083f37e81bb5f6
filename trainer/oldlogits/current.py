"""The ``current`` reference: the actor's weights when the batch arrives (decoupled PPO, most frameworks)."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from asyncrl.api.correction import ReferencePolicy
from asyncrl.trainer.megatron.batch import TrainBatch
from asyncrl.trainer.oldlogits.protocol import Scorer


@dataclass
class CurrentProvider:
    """``logp_ref`` = the ``logp_theta`` it is given, detached: the actor's weights when the batch arrives.

    The actor calls ``logp_ref`` once per batch, before the first update, and holds the result across
    every minibatch and epoch (decoupled PPO: after the first update ``pi_theta`` moves away from it
    and the clip acts on ``r_s``). With several updates it passes a no-grad forward run at arrival;
    with one update it passes the gradient forward's output, which runs under those same weights and
    is bit-identical to that extra forward (tested), so the single-update step costs no extra forward.
    """

    reference: ReferencePolicy = ReferencePolicy.CURRENT
    extra_forward: bool = False

    def score(self, batch: TrainBatch, scorer: Scorer) -> Tensor | None:
        return None

    def logp_ref(
        self, batch: TrainBatch, logp_theta: Tensor, actor_version: int, scored: Tensor | None
    ) -> Tensor:
        return logp_theta.detach()

    def observe_update(self, batch: TrainBatch, scorer: Scorer, keep_ratio: float) -> str:
        return ""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass
