"""The routing-replay fields of a training batch, from its trajectories' routes (rollout/routes.py).

``routes`` ``[B, T, L, k]``: each position's newest routes (the training forward and the ``current``/``ewma``
reference replay them); ``route_slots`` ``[B, S, T, L, k]`` with ``route_slot_versions`` ``[B, S]``: each row's
routes per version (an exact scoring forward replays, for the tokens of version ``v``, the prefix routes ``v``
sampled them through). Positions a block does not cover (padding, the never-fed last token) hold experts
``0..k-1``: no scored logit attends to them.
"""

from collections.abc import Sequence

import numpy as np
import torch

from asyncrl.rollout.trajectory import Trajectory


def route_fields(trajs: Sequence[Trajectory], T: int) -> dict[str, torch.Tensor]:
    """``{"routes", "route_slots", "route_slot_versions"}`` for the rows ``trajs`` padded to ``T``; empty when
    no trajectory carries routes. Raises ``ValueError`` when only some do (a row would replay made-up routes)."""
    logs = [t.routes for t in trajs]
    if all(log is None for log in logs):
        return {}
    missing = [t.traj_id for t, log in zip(trajs, logs, strict=True) if log is None]
    if missing:
        raise ValueError(f"routing replay: trajectories {missing[:5]} carry no expert routes while others do; "
                         "every row of a replayed batch needs its own")
    first = logs[0]
    assert first is not None
    L, k = first.moe_layers, first.top_k
    dtype = np.result_type(*[log.dtype for log in logs if log is not None])
    B, S = len(trajs), max(max(len(log.blocks) for log in logs if log is not None), 1)
    idle = np.arange(k, dtype=dtype)  # experts 0..k-1 where nothing attends
    routes = np.empty((B, T, L, k), dtype=dtype)
    routes[:] = idle
    slots = np.empty((B, S, T, L, k), dtype=dtype)
    slots[:] = idle
    slot_versions = np.full((B, S), -1, dtype=np.int64)
    for b, log in enumerate(logs):
        assert log is not None
        routes[b] = log.latest(T)
        for s, v in enumerate(log.blocks):
            block = log.for_version(v)[:T]
            slots[b, s, : len(block)] = block
            slot_versions[b, s] = v
    return {"routes": torch.from_numpy(routes), "route_slots": torch.from_numpy(slots),
            "route_slot_versions": torch.from_numpy(slot_versions)}
