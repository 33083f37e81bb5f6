"""The expert routes of one trajectory, per version: what routing replay (R3) replays in the actor.

A mixture-of-experts layer sends each position's hidden state to ``k`` of its experts. The logit that sampled
token ``t`` was computed at position ``t - 1`` and attended to positions ``0..t-1``, each of which went through
the routes chosen when *its* KV was computed. After a weight update the engine re-prefills the whole prefix
under the new version (rollout/hf_engine.py), so the prefix is routed again: a trajectory that spans versions
has, per version ``v``, routes for positions ``0..n_v - 1`` (the prefix every token of ``v`` attended through).
Exact ``pi_old`` for a segment of version ``v`` replays ``v``'s block (:meth:`RouteLog.for_version`); the
training forward, one pass over the whole trajectory, replays the newest routes of each position
(:meth:`RouteLog.latest`).

Storage: ``uint8`` when the model has at most 256 experts, else ``int16``; ``[n, moe_layers, k]`` per version.
numpy only (the trajectory crosses Ray and stays free of torch).
"""

from dataclasses import dataclass, field

import numpy as np

ROUTE_DTYPES = (np.uint8, np.int16)


def route_dtype(num_experts: int) -> type[np.integer]:
    """The smallest of ``uint8`` / ``int16`` that holds expert ids ``0..num_experts-1``."""
    if num_experts <= 256:
        return np.uint8
    if num_experts <= 32768:
        return np.int16
    raise ValueError(f"route_dtype: {num_experts} experts do not fit int16 expert ids")


@dataclass
class RouteLog:
    """Per-version route blocks of one trajectory; ``blocks`` in the order the versions first ran.

    Attributes:
        moe_layers: MoE layers of the model (``L``).
        top_k: experts per token (``k``).
        blocks: version -> chunks of ``[n, L, k]`` routes, contiguous from position 0.
    """

    moe_layers: int
    top_k: int
    blocks: dict[int, list[np.ndarray]] = field(default_factory=dict)

    def record(self, version: int, start: int, routes: np.ndarray) -> None:
        """Routes ``[n, L, k]`` of positions ``start..start+n-1`` computed under ``version``.

        A forward from position 0 (a prefill) starts the version's block afresh (a re-prefill under the same
        version replaces it: the later tokens attend through the newer KV); any other continues it.
        """
        if routes.ndim != 3 or routes.shape[1:] != (self.moe_layers, self.top_k):
            raise ValueError(f"RouteLog.record: routes must be [n, {self.moe_layers}, {self.top_k}]; "
                             f"got shape {routes.shape}")
        if start == 0:
            self.blocks.pop(version, None)
            self.blocks[version] = [routes]
            return
        have = self.length(version)
        if start != have:
            raise ValueError(f"RouteLog.record: version {version} has routes for positions 0..{have - 1}; "
                             f"got a block starting at {start}")
        self.blocks[version].append(routes)

    def length(self, version: int) -> int:
        """Positions with routes under ``version`` (0 when it has none)."""
        return sum(len(c) for c in self.blocks.get(version, []))

    def for_version(self, version: int) -> np.ndarray:
        """``[n_v, L, k]``: the routes every token sampled under ``version`` attended through."""
        chunks = self.blocks.get(version)
        if not chunks:
            raise KeyError(f"RouteLog: no routes recorded under version {version}; have {list(self.blocks)}")
        if len(chunks) > 1:  # consolidate once read
            chunks[:] = [np.concatenate(chunks)]
        return chunks[0]

    def latest(self, length: int) -> np.ndarray:
        """``[length, L, k]``: each position's newest routes (the last version's block, which always starts
        at 0); positions past it (the last token, never fed) repeat experts ``0..k-1``, which no scored
        logit attends to."""
        out = np.tile(np.arange(self.top_k, dtype=self.dtype), (length, self.moe_layers, 1))
        if self.blocks:
            last = self.for_version(next(reversed(self.blocks)))[:length]
            out[: len(last)] = last
        return out

    @property
    def dtype(self) -> np.dtype:
        for chunks in self.blocks.values():
            if chunks:
                return chunks[0].dtype
        return np.dtype(np.uint8)

    @property
    def nbytes(self) -> int:
        """Bytes of every stored route (all versions)."""
        return sum(c.nbytes for chunks in self.blocks.values() for c in chunks)

    def copy(self) -> "RouteLog":
        """A snapshot that later records do not change (an in-flight episode's, for interrupt-sync)."""
        return RouteLog(self.moe_layers, self.top_k, {v: list(c) for v, c in self.blocks.items()})
