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
    """``logp_ref = logp_theta.detach()``: no forward of its own.

    The actor takes one optimizer step per batch, so the weights the batch meets are exactly those
    of the gradient forward: its detached output is bit-identical to an extra no-grad forward
    (tested) and saves that forward.
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
