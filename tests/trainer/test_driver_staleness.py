"""The staleness buffer: the hard bound at the actor, AReaL admission capacity, drop accounting."""

import pytest

from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus
from asyncrl.trainer.driver.loop.staleness import StalenessBuffer, check_staleness, group_gap


def traj(group: str, versions: list[int], idx: int = 0, status=TrajectoryStatus.FINISHED) -> Trajectory:
    """Prompt of 2 tokens (version -1) followed by the given agent-token versions (-1 = env token)."""
    vs = [-1, -1, *versions]
    n = len(vs)
    return Trajectory(
        traj_id=f"{group}-{idx}", group_id=group, task="t", tokens=list(range(n)), prompt_len=2,
        loss_mask=[v >= 0 for v in vs], versions=vs, logp_mu=[0.0] * n, turn_ids=[0] * n, status=status,
    )


def group(gid: str, versions: list[int], size: int = 2) -> list[Trajectory]:
    return [traj(gid, versions, i) for i in range(size)]


def test_gap_is_actor_version_minus_oldest_sampled_token():
    g = [traj("a", [3, -1, 4]), traj("a", [4, 5], 1)]  # env token (-1) is ignored
    assert group_gap(g, 5) == 2  # 5 - min(3, 4) = 2
    assert group_gap([traj("b", [-1])], 7) == 0  # nothing sampled: nothing can be stale


def test_gap_rejects_versions_from_the_future():
    with pytest.raises(ValueError, match="version 6 but the actor is at version 5"):
        group_gap([traj("a", [5, 6])], 5)


def test_synchronous_capacity_admits_one_batch_per_version():
    buf = StalenessBuffer(max_staleness=0, groups_per_step=4)
    assert buf.capacity(0) == 4  # (0 + 0 + 1) * 4
    assert buf.reserve(10, 0) == 4
    assert buf.capacity(0) == 0
    buf.put([t for i in range(4) for t in group(f"g{i}", [0, 0])], reserved=4)
    assert buf.capacity(0) == 0  # accepted groups still count until the version moves
    batch, dropped = buf.take_batch(0)
    assert batch is not None and len(batch) == 4 and dropped.groups == 0
    assert buf.capacity(0) == 0 and buf.capacity(1) == 4  # (0 + 1 + 1) * 4 - 4 accepted


def test_async_capacity_runs_ahead_by_w_batches_only():
    buf = StalenessBuffer(max_staleness=2, groups_per_step=3)
    assert buf.reserve(100, 0) == 9  # (2 + 0 + 1) * 3: three batches ahead, no more
    assert buf.capacity(0) == 0
    assert buf.capacity(1) == 3  # one step later one more batch may start


def test_resume_counts_steps_from_the_base_version():
    buf = StalenessBuffer(max_staleness=1, groups_per_step=2, base_version=40)
    assert buf.capacity(40) == 4  # (1 + 0 + 1) * 2


def test_max_running_groups_caps_in_flight_work():
    buf = StalenessBuffer(max_staleness=4, groups_per_step=2, max_running_groups=3)
    assert buf.reserve(10, 0) == 3


def test_over_stale_groups_are_dropped_counted_and_free_their_slot():
    buf = StalenessBuffer(max_staleness=1, groups_per_step=1)
    assert buf.reserve(2, 0) == 2
    buf.put(group("old", [0, 0]), reserved=1)
    buf.put(group("new", [0, 1]), reserved=1)
    # At actor version 2, "old" has gap 2 > 1 and "new" has gap 2 as well (its oldest token is 0).
    batch, dropped = buf.take_batch(2)
    assert batch is None
    assert (dropped.groups, dropped.trajectories, dropped.sampled_tokens) == (2, 4, 8)  # 2 groups x 2 x 2
    c = buf.counts
    assert (c.groups_dropped_stale, c.trajectories_dropped_stale, c.tokens_dropped_stale) == (2, 4, 8)
    # Dropped groups no longer count as accepted: (1 + 2 + 1) * 1 - 0 = 4 slots at version 2.
    assert buf.capacity(2) == 4


def test_batches_take_the_oldest_groups_first_and_never_exceed_the_bound():
    buf = StalenessBuffer(max_staleness=2, groups_per_step=2)
    buf.reserve(4, 2)
    buf.put(group("v2", [2]) + group("v1", [1, 2]) + group("v0", [0, 1]) + group("v2b", [2]), reserved=4)
    batch, dropped = buf.take_batch(2)
    assert [g[0].group_id for g in batch] == ["v0", "v1"]
    assert check_staleness(batch, 2, 2) == 2
    assert dropped.groups == 0 and buf.ready == 2


def test_whole_groups_move_together_and_aborted_members_are_counted():
    buf = StalenessBuffer(max_staleness=1, groups_per_step=1)
    buf.reserve(2, 0)
    members = group("a", [0, 0], size=3)
    members[1].status = TrajectoryStatus.ABORTED
    assert buf.put(members, reserved=2) == 1  # group "a" survives, the second reserved group is lost
    assert buf.counts.trajectories_aborted == 1 and buf.counts.groups_aborted == 1
    batch, _ = buf.take_batch(0)
    assert [t.traj_id for t in batch[0]] == ["a-0", "a-2"]
    assert buf.running == 0


def test_every_admitted_group_ends_in_one_bucket():
    buf = StalenessBuffer(max_staleness=1, groups_per_step=2)
    buf.reserve(4, 0)
    buf.put(group("a", [0]) + group("b", [0]), reserved=2)
    buf.abort(2)
    buf.take_batch(0)
    c = buf.counts
    assert c.groups_admitted == c.groups_consumed + c.groups_dropped_stale + c.groups_aborted + buf.ready + buf.running


def test_check_staleness_is_a_hard_guard():
    with pytest.raises(RuntimeError, match="gap 3 > async.maxStaleness 2"):
        check_staleness([group("a", [1])], 4, 2)


def test_put_rejects_inconsistent_reports():
    buf = StalenessBuffer(max_staleness=0, groups_per_step=1)
    with pytest.raises(ValueError, match="only 0 groups are running"):
        buf.put(group("a", [0]), reserved=1)
    buf.reserve(1, 0)
    with pytest.raises(ValueError, match="2 groups came back for 1 reserved"):
        buf.put(group("a", [0]) + group("b", [0]), reserved=1)


def _fill_and_take(buf: StalenessBuffer, version: int, tag: str) -> list:
    """Admit what capacity allows, return it all as fresh groups, take one batch."""
    n = buf.reserve(100, version)
    buf.put([t for i in range(n) for t in group(f"{tag}{i}", [version])], reserved=n)
    batch, _ = buf.take_batch(version)
    assert batch is not None
    return batch


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
def test_skipped_steps_do_not_consume_admission_capacity(max_staleness):
    B = 2
    buf = StalenessBuffer(max_staleness=max_staleness, groups_per_step=B)
    full = (max_staleness + 1) * B  # capacity at an empty buffer: W + 1 batches
    assert buf.capacity(0) == full
    # More skipped steps than W + 1 (which used to stall admission for good), all at version 0.
    for k in range(max_staleness + 3):
        batch = _fill_and_take(buf, 0, f"s{k}-")
        buf.step_skipped(len(batch))
        # Each round admits up to the limit and takes one batch, so (W + 1) B - B groups wait, holding
        # their slots; the skipped batch's B slots are free again: capacity (W + 1) B - W B = B, not 0.
        assert buf.ready == full - B and buf.capacity(0) == B
    assert buf.counts.groups_skipped == (max_staleness + 3) * B
    # An applied step then counts as on a buffer that never skipped: its B groups plus the W B waiting
    # fill the limit at version 0, and version 1 allows (W + 2) B - (W + 1) B = B more.
    _fill_and_take(buf, 0, "ok-")
    assert buf.capacity(0) == 0 and buf.capacity(1) == B
    c = buf.counts
    assert c.groups_admitted == c.groups_consumed + c.groups_dropped_stale + c.groups_aborted + buf.ready + buf.running


def test_step_skipped_rejects_more_groups_than_were_consumed():
    buf = StalenessBuffer(max_staleness=0, groups_per_step=1)
    batch = _fill_and_take(buf, 0, "a")
    with pytest.raises(ValueError, match=r"step_skipped\(groups=2\) but 1 consumed groups"):
        buf.step_skipped(2)
    buf.step_skipped(len(batch))
    with pytest.raises(ValueError, match=r"step_skipped\(groups=1\) but 0 consumed groups"):
        buf.step_skipped(1)
