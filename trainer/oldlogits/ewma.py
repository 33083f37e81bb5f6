"""The ``ewma`` reference (PPO-EWMA, paper §5.2): a parameter EWMA ``theta_prox`` scored by the actor.

Cost: one weight copy (``theta_prox``, kept here; the default ``reset.rule: recentre`` adds ``W`` bf16 residuals,
``W / 2`` copies' worth, :mod:`asyncrl.trainer.correction.ewma_history`) and one no-grad forward per batch (at its arrival;
the result is held across the batch's minibatches and epochs). ``theta_prox`` folds in the weights
once per version, after all the batch's updates (the controller's module docstring says why). The EWMA math
(decay, bias correction, resets) is :class:`asyncrl.trainer.correction.ewma_controller.EwmaController`; this
provider owns the controller, starts it from the weights RL starts with, feeds it every update and
checkpoints it.

With a sharded actor ``theta_prox`` is per shard (the fp32 copy of this rank's tensor-parallel shard, under
its local names: the blend is elementwise, so exact per shard), and every rank must reset at the same
versions, or the replicas' ``theta_prox`` would part. The statistics that decide it are global: the
in-bounds ratio comes from the DP-reduced correction counts, the staleness from the whole batch (every rank
holds it); :func:`same_on_every_rank` checks the decision anyway, since a rank that reset alone would train
on a silently different reference.
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from asyncrl.api.correction import EwmaSpec, ReferencePolicy
from asyncrl.trainer.oldlogits.protocol import PaddedBatch, Scorer

if TYPE_CHECKING:
    from asyncrl.trainer.correction.ewma_controller import EwmaController, EwmaStepReport
    from asyncrl.trainer.correction.ewma_reset import ResetStatus


def same_on_every_rank(flag: bool, what: str) -> None:
    """Raise unless ``flag`` is the same on every rank of the actor group (one MIN all-reduce of
    ``(flag, -flag)``; nothing in one process)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    buf = torch.tensor([float(flag), -float(flag)])
    dist.all_reduce(buf, op=dist.ReduceOp.MIN)
    if float(buf[0]) != -float(buf[1]):
        raise RuntimeError(
            f"{what}: rank {dist.get_rank()} decided {flag}, another rank the opposite; the decision must come "
            "from DP-reduced statistics (parallel.reduce_stats) so that every rank keeps the same theta_prox"
        )


class EwmaProvider:
    """``logp_ref`` = the actor's forward under ``theta_prox``."""

    reference = ReferencePolicy.EWMA
    extra_forward = True

    def __init__(self, spec: EwmaSpec, *, max_staleness: int) -> None:
        self.spec = spec
        self.max_staleness = max_staleness
        # Created on first use from the live weights, so supervised warm-start steps are not averaged in.
        self.controller: EwmaController | None = None
        self.last_report: EwmaStepReport | None = None  # the controller's report of the last version

    def reset_status(self) -> "ResetStatus":
        """The reset rule's threshold and outcomes at the last version, for the step report."""
        from asyncrl.trainer.correction.ewma_reset import ResetStatus

        r, ctl = self.last_report, self.controller
        return ResetStatus(
            threshold=float("nan") if r is None else r.threshold,
            outcome="" if r is None or not r.outcomes else r.outcomes[-1],
            recovered_total=0 if ctl is None else ctl.rule.recovered,
            unrecovered_total=0 if ctl is None else ctl.rule.unrecovered)

    def _ensure(self, scorer: Scorer) -> "EwmaController":
        if self.controller is None:
            # Imported here: asyncrl.trainer.correction re-exports names of this package (no cycle).
            from asyncrl.trainer.correction.ewma_controller import EwmaController

            self.controller = EwmaController.from_spec(self.spec, max_staleness=self.max_staleness)
            self.controller.init(scorer.named_weights(), version=scorer.version)
        return self.controller

    def weights(self, scorer: Scorer) -> Mapping[str, Tensor]:
        """``theta_prox`` (routing replay R2 records the routes of a forward under it)."""
        return self._ensure(scorer).params

    def score(self, batch: PaddedBatch, scorer: Scorer) -> Tensor | None:
        return scorer.logprobs_under(self._ensure(scorer).params, batch.tokens, batch.routes)

    def logp_ref(
        self, batch: PaddedBatch, logp_theta: Tensor, actor_version: int, scored: Tensor | None
    ) -> Tensor:
        if scored is None:
            raise ValueError("the ewma reference needs its forward: call score() before logp_ref()")
        return scored.detach()

    def observe_update(self, batch: PaddedBatch, scorer: Scorer, keep_ratio: float) -> str:
        """Fold the new version's weights into ``theta_prox`` and the batch's mean staleness into the
        measured window; ``keep_ratio``: the batch's in-bounds ratio of ``r_d`` (the reset statistic);
        the reset reason, or "" when none."""
        ewma = self._ensure(scorer)
        # One version per batch: the batch met scorer.version - 1, whatever the number of updates.
        gaps = (scorer.version - 1 - batch.versions)[batch.loss_mask]
        if gaps.numel():
            ewma.observe_staleness(gaps.float().mean())
        valid = batch.versions[batch.loss_mask]
        token_versions = ({int(v): int(n) for v, n in zip(*torch.unique(valid, return_counts=True), strict=True)}
                          if ewma.rule.rule == "recentre" else None)
        report = ewma.update(scorer.named_weights(), keep_ratio, version=scorer.version, token_versions=token_versions)
        self.last_report = report
        same_on_every_rank(report.reset, f"the ewma reset at version {scorer.version} (in-bounds ratio {keep_ratio})")
        return str(report.reason) if report.reset else ""

    def state_dict(self) -> dict[str, Any]:
        return {"ewma": self.controller.state_dict() if self.controller is not None else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["ewma"] is None:
            self.controller = None
            return
        from asyncrl.trainer.correction.ewma_controller import EwmaController

        self.controller = EwmaController.from_spec(self.spec, max_staleness=self.max_staleness)
        self.controller.load_state_dict(state["ewma"])
