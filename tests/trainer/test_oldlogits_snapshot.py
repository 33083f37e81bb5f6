"""The snapshot store and the driver's retention helpers: release, hard cap, disk spill (no model needed)."""

import pytest
import torch

from asyncrl.rollout.trajectory import NO_VERSION, Trajectory
from asyncrl.trainer.oldlogits import MissingSnapshotError, WeightSnapshots
from asyncrl.trainer.oldlogits.retention import cap_drop, live_versions


def _weights(value: float) -> dict[str, torch.Tensor]:
    return {"a": torch.full((3,), float(value)), "b": torch.full((2, 2), float(value))}  # 7 fp32 values = 28 bytes


def test_retain_releases_everything_not_live_at_once() -> None:
    store = WeightSnapshots(capacity=4)
    for v in range(4):
        store.record(v, _weights(v))
    assert store.retain({1, 3, 9}) == [0, 2]  # 9 was never recorded: nothing to keep
    assert store.versions == [1, 3] and store.nbytes == 2 * 28
    assert torch.equal(store.get(3)["a"], torch.full((3,), 3.0))
    with pytest.raises(MissingSnapshotError, match="version 2 was released: the live versions passed"):
        store.get(2)
    with pytest.raises(MissingSnapshotError, match="version 7 was never recorded"):
        store.check([1, 7])
    store.record(2, _weights(20))  # recorded again after a release: resident, no stale error
    assert store.versions == [1, 2, 3] and float(store.get(2)["a"][0]) == 20.0


def test_the_cap_gives_up_the_oldest_version_and_a_token_of_it_raises_with_the_fix() -> None:
    store = WeightSnapshots(capacity=2)
    for v in range(3):
        store.record(v, _weights(v))
    assert store.versions == [1, 2]  # never more than the cap resident
    with pytest.raises(MissingSnapshotError) as err:
        store.check([0, 2])
    message = str(err.value)
    assert "version 0 was given up at the cap of 2 resident versions (oldLogits.snapshot.maxVersions)" in message
    assert "cap_drop" in message and "raise oldLogits.snapshot.maxVersions" in message
    # A resume with a smaller cap keeps the newest.
    smaller = WeightSnapshots(capacity=1)
    smaller.load_state_dict(store.state_dict())
    assert smaller.versions == [2] and torch.equal(smaller.get(2)["b"], _weights(2)["b"])
    with pytest.raises(ValueError, match="must be >= 1"):
        WeightSnapshots(capacity=0)


def test_disk_store_round_trips_through_files_and_deletes_them(tmp_path) -> None:
    folder = tmp_path / "snapshots"
    store = WeightSnapshots(capacity=3, device="disk", work_dir=str(folder))
    live = _weights(1.5)
    for v in range(3):
        store.record(v, {n: t + v for n, t in live.items()})
    live["a"].add_(100.0)  # the files hold copies taken at record time
    assert sorted(p.name for p in folder.iterdir()) == ["v0.safetensors", "v1.safetensors", "v2.safetensors"]
    assert store.nbytes == sum(p.stat().st_size for p in folder.iterdir())
    got = store.get(1)
    assert torch.equal(got["a"], torch.full((3,), 2.5)) and torch.equal(got["b"], torch.full((2, 2), 2.5))
    store.retain({1, 2})
    assert sorted(p.name for p in folder.iterdir()) == ["v1.safetensors", "v2.safetensors"]
    state = store.state_dict()  # tensors, not file names: later releases cannot break a resume
    store.close()
    assert list(folder.iterdir()) == []
    rebuilt = WeightSnapshots(capacity=3, device="disk", work_dir=str(folder))
    rebuilt.load_state_dict(state)
    assert rebuilt.versions == [1, 2] and torch.equal(rebuilt.get(2)["a"], torch.full((3,), 3.5))
    assert sorted(p.name for p in folder.iterdir()) == ["v1.safetensors", "v2.safetensors"]
    rebuilt.close()

    private = WeightSnapshots(capacity=1, device="disk")  # no work_dir: a private temporary folder
    private.record(0, live)
    path = private.path(0)
    assert path is not None and path.is_file()
    private.close()
    assert not path.parent.exists()


def _trajectory(versions: list[int]) -> Trajectory:
    n = len(versions)
    return Trajectory(
        traj_id="t", group_id="g", task="calculator", tokens=[1] * n, prompt_len=1,
        loss_mask=[v != NO_VERSION for v in versions], versions=versions, logp_mu=[0.0] * n,
        turn_ids=[0 if v != NO_VERSION else -1 for v in versions],
    )


def test_live_versions_are_the_trainable_versions_still_referenced() -> None:
    # W = 2, the step trains at version 5: after it (version 6) versions >= 4 can still be trained.
    ready = [
        [_trajectory([NO_VERSION, 4, 4, 5]), _trajectory([NO_VERSION, 5])],  # a partial spanning 4 and 5
        [_trajectory([NO_VERSION, 3, 3])],  # version 3 is past the bound after the step: not live
    ]
    assert live_versions(ready, [], current=5, max_staleness=2) == {4, 5, 6}
    # A generate call in flight since version 2 may hold any of 2..5; only 4 and 5 stay trainable.
    assert live_versions([], [2], current=5, max_staleness=2) == {4, 5, 6}
    assert live_versions([], [5], current=5, max_staleness=2) == {5, 6}  # fewer than W + 1 = 3
    assert live_versions([], [], current=5, max_staleness=0) == {6}
    with pytest.raises(ValueError, match="started at version 7, after the actor's current version 5"):
        live_versions([], [7], current=5, max_staleness=2)


def test_cap_drop_gives_up_the_oldest_versions_beyond_the_cap() -> None:
    assert cap_drop({4, 5, 6}, 3) == set()
    assert cap_drop({3, 4, 5, 6}, 2) == {3, 4}
    with pytest.raises(ValueError, match="maxVersions\\) must be >= 1; got 0"):
        cap_drop({1}, 0)
