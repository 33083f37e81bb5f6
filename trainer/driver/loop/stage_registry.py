"""The driver-side old-logit stage of a job: :func:`make_stage`, one builder per ``spec.old_logits_route``.

It sits above the stages (:mod:`.stage` <- :mod:`.stages`, :mod:`.dedicated_stage` <- this module), so
no stage module imports another one's subclass.
"""

from collections.abc import Callable

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.old_logits_route import OldLogitsRoute
from asyncrl.trainer.driver.loop.dedicated_stage import DedicatedStage
from asyncrl.trainer.driver.loop.stage import PhaseCallback, Stage
from asyncrl.trainer.driver.loop.stages import InterruptSyncStage, SnapshotStage

StageBuilder = Callable[[AsyncRLJobSpec, PhaseCallback | None], Stage]


def _no_route(spec: AsyncRLJobSpec, on_phase: PhaseCallback | None) -> Stage:
    # The audit of a cheap reference keeps weight snapshots of the live versions, like snapshot (uncapped).
    return SnapshotStage() if spec.correction.audit.enabled else Stage()


STAGES: dict[OldLogitsRoute, StageBuilder] = {
    OldLogitsRoute.NONE: _no_route,
    OldLogitsRoute.SNAPSHOT: lambda spec, _: SnapshotStage(spec.snapshot_versions),
    OldLogitsRoute.INTERRUPT_SYNC: InterruptSyncStage,
    OldLogitsRoute.DEDICATED: lambda spec, _: DedicatedStage(spec),
}


def make_stage(spec: AsyncRLJobSpec, on_phase: PhaseCallback | None = None) -> Stage:
    """The driver-side stage of ``spec.old_logits_route`` (``on_phase``: every interrupt-sync phase change)."""
    route = spec.old_logits_route
    if route not in STAGES:
        raise ValueError(f"old-logits route {route!r} has no driver stage; the routes with one: "
                         f"{', '.join(r.value for r in STAGES)}")
    return STAGES[route](spec, on_phase)
