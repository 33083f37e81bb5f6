"""Which weight versions must stay resident: the driver's side of snapshot retention (pure).

A version must stay as long as a token that can still be trained references it (issue 8 §2). The
driver knows those tokens; the actor's stores only keep what it is told
(``MegatronActor.train_step(batch, live_versions=...)``). Per step, the driver calls::

    live = live_versions(waiting_groups, [*admitted_at, current], current, W)
    gone = cap_drop(live, cap)          # over oldLogits.snapshot.maxVersions: the oldest versions
    # drop (and count) the groups holding a version in `gone`, then
    actor.train_step(batch, live_versions=live - gone)

(``trainer/driver/loop/stages.py``, ``SnapshotStage.step_kwargs``, is that caller.) ``current`` itself is
passed as a call in flight since ``current``: rollout keeps sampling with it until the step's weights
arrive, also in calls admitted while the actor trains, so it stays live while the window admits it.

Why ``current + 1 - W``: after the step the actor is at ``current + 1`` and the staleness bound
admits a token of version ``v`` only while ``current + 1 - v <= W``; an older token can never be
trained again (the buffer drops it), so its version is not live whatever still holds it.
"""

from collections.abc import Iterable, Sequence

from asyncrl.rollout.trajectory import Trajectory


def live_versions(
    ready: Iterable[Sequence[Trajectory]],
    in_flight_since: Iterable[int],
    current: int,
    max_staleness: int,
) -> set[int]:
    """The versions a not-yet-trained token may reference once the step at ``current`` is done.

    Args:
        ready: groups not trained yet (the staleness buffer's ready groups, suspended partial
            trajectories, the next batch if it is already taken): every sampled token's version.
        in_flight_since: for each generate call still running, the actor version when it started:
            its tokens may carry any version from that one to ``current``.
        current: the version the step trains at (the batch meets it).
        max_staleness: ``W`` (``async.maxStaleness``).

    Returns:
        The live versions in ``[current + 1 - W, current]`` plus ``current + 1`` (the version the
        step makes; rollout samples from it next, so a cap must count it).
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness (async.maxStaleness) must be >= 0; got {max_staleness}")
    floor = current + 1 - max_staleness  # the oldest version trainable after the step
    live = {current + 1}
    for group in ready:
        for t in group:
            live.update(v for v in t.sampled_versions if v >= floor)
    for since in in_flight_since:
        if since > current:
            raise ValueError(
                f"a generate call started at version {since}, after the actor's current version {current}; "
                "in_flight_since must hold versions the actor already produced"
            )
        live.update(range(max(since, floor), current + 1))
    return live


def cap_drop(live: set[int], cap: int) -> set[int]:
    """The oldest versions of ``live`` to give up so that at most ``cap`` stay resident.

    The driver drops (and counts) the groups holding them before training; the store would give up
    the same oldest versions itself, and a token of one of them raises ``MissingSnapshotError``.
    """
    if cap < 1:
        raise ValueError(f"cap (oldLogits.snapshot.maxVersions) must be >= 1; got {cap}")
    excess = len(live) - cap
    return set(sorted(live)[:excess]) if excess > 0 else set()
