"""The AsyncRLJob API: typed spec models, defaults, validation and the generated CRD.

This package imports nothing heavy (no torch, ray or kopf): the operator, the CLI and the
trainer all depend on it, never the other way round (docs/architecture.md, dependency rules).
"""

from asyncrl.api.correction import (
    Bounds,
    ClipSpec,
    CorrectionSpec,
    DiscrepancyLevel,
    DiscrepancyMode,
    EwmaResetSpec,
    EwmaSpec,
    MaskSpec,
    ReferencePolicy,
)
from asyncrl.api.evaluation import EvalMode, EvalSpec
from asyncrl.api.job import (
    API_VERSION,
    GROUP,
    KIND,
    AsyncRLJob,
    AsyncRLJobSpec,
    AsyncSpec,
    CheckpointSpec,
)
from asyncrl.api.model import ModelSpec
from asyncrl.api.old_logits import OldLogitsSpec, OldLogitStrategy
from asyncrl.api.task import TaskSpec
from asyncrl.api.validation import SpecError, SpecProblem, load_jobs, validate_job

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "AsyncRLJob",
    "AsyncRLJobSpec",
    "AsyncSpec",
    "Bounds",
    "CheckpointSpec",
    "EvalMode",
    "EvalSpec",
    "ClipSpec",
    "CorrectionSpec",
    "DiscrepancyLevel",
    "DiscrepancyMode",
    "EwmaResetSpec",
    "EwmaSpec",
    "MaskSpec",
    "ModelSpec",
    "OldLogitStrategy",
    "OldLogitsSpec",
    "ReferencePolicy",
    "SpecError",
    "SpecProblem",
    "TaskSpec",
    "load_jobs",
    "validate_job",
]
