"""What one actor step reports to the driver: :func:`step_record` turns the actor's
:class:`~asyncrl.trainer.actor.megatron_actor.TrainStepMetrics` into the record the driver keeps."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl.trainer.actor.megatron_actor import TrainStepMetrics


def step_record(out: "TrainStepMetrics") -> dict[str, Any]:
    """The step's flat record (``"applied"``: the version advanced)."""
    return {
        "applied": out.stepped, "loss": out.loss, "grad_norm": out.grad_norm, "reference": out.reference,
        "ewma_reset": int(out.ewma_reset), "ewma_reset_reason": out.ewma_reset_reason,
        "actor_forward_s": round(out.forward_seconds, 4),
        "actor_reference_s": round(out.reference_seconds, 4), "actor_backward_s": round(out.backward_seconds, 4),
        "snapshot_versions": out.snapshot_versions, "snapshot_bytes": out.snapshot_bytes,
        "actor_audit_s": round(out.audit_seconds, 4),
        # train.minibatches x train.epochs updates per batch; "applied" = the version advanced
        "updates": out.updates, "updates_applied": out.updates_applied, "updates_skipped": out.updates_skipped,
        "micro_batches": out.micro_batches, "loss_last": out.loss_last, "grad_norm_last": out.grad_norm_last,
        "in_bounds_ratio": out.in_bounds_ratio,
        **out.correction, **out.audit,
    }
