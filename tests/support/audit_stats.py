"""One process's audit of some rows in one call, for the audit's tests (production audits by parts,
:func:`~asyncrl.trainer.oldlogits.audit.audit_parts` per DP rank merged by
:func:`~asyncrl.trainer.oldlogits.audit.merge_parts`)."""

from torch import Tensor

from asyncrl.api.correction import CorrectionSpec
from asyncrl.trainer.oldlogits.audit import AuditStats, audit_parts, merge_parts


def audit_stats(
    logp_theta: Tensor,
    logp_ref: Tensor,
    logp_old: Tensor,
    logp_mu: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    spec: CorrectionSpec,
    *,
    turn_ids: Tensor | None = None,
    rows: int | None = None,
    rows_unscorable: int = 0,
) -> AuditStats:
    """How far ``logp_ref`` is from the exact ``logp_old`` on these rows (``[b, T]`` each, as
    :func:`~asyncrl.trainer.oldlogits.audit.audit_parts`): one process's parts, merged."""
    part = audit_parts(logp_theta, logp_ref, logp_old, logp_mu, advantages, loss_mask, spec, turn_ids=turn_ids)
    return merge_parts([part], rows=loss_mask.shape[0] if rows is None else rows, rows_unscorable=rows_unscorable)
