"""Moved: reference policies live in :mod:`asyncrl.trainer.oldlogits` (one registry, one provider per reference).

The closed forms (``behavior``, ``linear``, ``loglinear``, the version gaps) are in
:mod:`asyncrl.trainer.oldlogits.closed_form`, the registry in :mod:`asyncrl.trainer.oldlogits.registry`.
These names are re-exported only because :mod:`asyncrl.trainer.correction` still exports them; this
module goes once that package stops doing so.
"""

from asyncrl.trainer.oldlogits.closed_form import (
    behavior_reference,
    behaviour_weight,
    linear_reference,
    loglinear_reference,
    version_gaps,
)
from asyncrl.trainer.oldlogits.registry import PROVIDERS as REFERENCES
from asyncrl.trainer.oldlogits.registry import reference_logp

__all__ = [
    "REFERENCES",
    "behaviour_weight",
    "behavior_reference",
    "linear_reference",
    "loglinear_reference",
    "reference_logp",
    "version_gaps",
]
