"""``make_stage``: the driver-side stage of every old-logits route (and of the audit of a cheap reference)."""

from typing import Any

import pytest

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.old_logits_route import OldLogitsRoute
from asyncrl.trainer.driver.loop.dedicated_stage import DedicatedStage
from asyncrl.trainer.driver.loop.stage import Stage
from asyncrl.trainer.driver.loop.stage_registry import STAGES, make_stage
from asyncrl.trainer.driver.loop.stages import InterruptSyncStage, SnapshotStage


def _spec(**spec: Any) -> AsyncRLJobSpec:
    return AsyncRLJobSpec.model_validate(spec)


def test_a_cheap_reference_has_no_stage_work() -> None:
    stage = make_stage(_spec(correction={"reference": "behavior"}))
    assert type(stage) is Stage and stage.name == "none"


def test_the_audit_of_a_cheap_reference_keeps_snapshots_uncapped() -> None:
    stage = make_stage(_spec(correction={"reference": "ewma", "audit": {"everyNSteps": 5}}))
    assert isinstance(stage, SnapshotStage) and stage.cap == 0


@pytest.mark.parametrize(("max_versions", "cap"), [(0, 3 + 1), (6, 6)])  # 0: auto, W+1 with W = 3
def test_snapshot_is_capped_at_the_versions_in_force(max_versions: int, cap: int) -> None:
    stage = make_stage(_spec(correction={"reference": "exact"}, **{"async": {"maxStaleness": 3}},
                             oldLogits={"strategy": "snapshot", "snapshot": {"maxVersions": max_versions}}))
    assert isinstance(stage, SnapshotStage) and stage.cap == cap


def test_interrupt_sync_gets_the_phase_callback_and_dedicated_its_spec() -> None:
    phases: list[str] = []
    spec = _spec(correction={"reference": "exact"}, oldLogits={"strategy": "interruptSync"})
    stage = make_stage(spec, phases.append)
    assert isinstance(stage, InterruptSyncStage) and stage.on_phase == phases.append
    dedicated = _spec(correction={"reference": "exact"}, oldLogits={"strategy": "dedicated"})
    got = make_stage(dedicated)
    assert isinstance(got, DedicatedStage) and got.spec is dedicated


def test_every_route_has_a_stage() -> None:
    assert set(STAGES) == set(OldLogitsRoute)
