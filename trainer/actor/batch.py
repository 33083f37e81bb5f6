"""The one batch record from the driver to the actor: a padded, per-token-aligned training batch.

The driver builds it (:func:`asyncrl.trainer.driver.loop.grpo_batch.assemble_batch`), sends it over the Ray
boundary as ``{field: numpy array}`` (:meth:`TrainBatch.to_numpy` / :meth:`TrainBatch.from_numpy`,
both derived from the record's fields) and the actor trains on it. Every field keeps its name from
the trajectory to the actor. The old-logit providers read it as
:class:`~asyncrl.trainer.oldlogits.protocol.PaddedBatch` (the fields they read), so ``trainer/oldlogits`` stays
below the actor that owns the record.
"""

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "tokens": (torch.long,),
    "loss_mask": (torch.bool,),
    "logp_mu": (torch.float32, torch.float64),
    "versions": (torch.long,),
    "advantages": (torch.float32, torch.float64),
    "turn_ids": (torch.long,),
    "logp_old": (torch.float32, torch.float64),
    "routes": (torch.uint8, torch.int16),
    "route_slots": (torch.uint8, torch.int16),
    "route_slot_versions": (torch.long,),
}
OPTIONAL = ("logp_old", "routes", "route_slots", "route_slot_versions")  # may be None (left out of to_numpy)



@dataclass(frozen=True)
class TrainBatch:
    """One right-padded batch; every tensor is ``[B, T]`` and aligned per token.

    Position ``t`` of every field describes ``tokens[:, t]``: ``logp_mu[:, t]`` is the inference
    log-prob with which ``tokens[:, t]`` was sampled, ``versions[:, t]`` the policy version that
    sampled it. Prompt, environment and padding tokens have ``loss_mask = False``, padding also
    ``versions = -1``, ``logp_mu = 0``, ``advantages = 0`` and ``turn_ids = -1``.

    Attributes:
        tokens: ``[B, T]`` long token ids (right-padded).
        loss_mask: ``[B, T]`` bool, True = an agent-sampled token that is trained on.
        logp_mu: ``[B, T]`` float inference-side log-prob (``mu_old``) of each sampled token.
        versions: ``[B, T]`` long version that generated each token (-1 for untrained tokens).
        advantages: ``[B, T]`` float advantage of each token (a sequence's, broadcast; 0 on padding).
        turn_ids: ``[B, T]`` long assistant turn of each trained token (-1 elsewhere); the loss's
            ``turn_ids`` for ``correction.level: turn``.
        logp_old: ``[B, T]`` float exact training-side old log-prob of each token under the version that
            sampled it, scored before the batch reached the actor (``oldLogits.strategy`` dedicated or
            interruptSync); NaN where not scored. None when no strategy pre-scores tokens.
        routes: ``[B, T, L, k]`` (uint8 or int16) the top-k experts of each position in each of the ``L`` MoE
            layers, each position's newest (rollout/routes.py ``RouteLog.latest``): what the training forward
            and the ``current``/``ewma`` reference forward replay (``correction.routingReplay``). None: no replay.
        route_slots: ``[B, S, T, L, k]`` each row's routes per version it was sampled under (slot ``s`` of row
            ``b`` is version ``route_slot_versions[b, s]``'s prefix routes, ``RouteLog.for_version``): what
            an exact scoring forward replays for that version's tokens. None with ``routes`` None.
        route_slot_versions: ``[B, S]`` long, the version of each slot (-1: an empty slot).
    """

    tokens: torch.Tensor
    loss_mask: torch.Tensor
    logp_mu: torch.Tensor
    versions: torch.Tensor
    advantages: torch.Tensor
    turn_ids: torch.Tensor
    logp_old: torch.Tensor | None = None
    routes: torch.Tensor | None = None
    route_slots: torch.Tensor | None = None
    route_slot_versions: torch.Tensor | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.tokens.dim() != 2:
            problems.append(f"tokens must be [B, T]; got shape {tuple(self.tokens.shape)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in OPTIONAL:
                continue
            if not self._fits(f.name, value):
                problems.append(f"{f.name} has shape {tuple(value.shape)}, tokens has {tuple(self.tokens.shape)}")
            if value.dtype not in _DTYPES[f.name]:
                allowed = " or ".join(str(d) for d in _DTYPES[f.name])
                problems.append(f"{f.name} has dtype {value.dtype}, expected {allowed}")
        if problems:
            raise ValueError("TrainBatch: " + "; ".join(problems))

    def _fits(self, name: str, value: torch.Tensor) -> bool:
        """Whether ``value`` has the shape field ``name`` needs against ``tokens`` ``[B, T]``."""
        B, T = self.tokens.shape[0], self.tokens.shape[-1]
        if name == "routes":  # [B, T, L, k]
            return value.dim() == 4 and tuple(value.shape[:2]) == (B, T)
        if name == "route_slots":  # [B, S, T, L, k]
            slots = self.route_slot_versions
            return (value.dim() == 5 and value.shape[0] == B and value.shape[2] == T
                    and (slots is None or value.shape[1] == slots.shape[1]))
        if name == "route_slot_versions":  # [B, S]
            return value.dim() == 2 and value.shape[0] == B
        return tuple(value.shape) == tuple(self.tokens.shape)

    @property
    def shape(self) -> tuple[int, int]:
        B, T = self.tokens.shape
        return B, T

    # ---------------------------------------------------------------- the Ray boundary
    def to_numpy(self) -> dict[str, np.ndarray]:
        """``{field: array}`` of every field (CPU), for the Ray object store."""
        return {
            f.name: getattr(self, f.name).detach().cpu().numpy()
            for f in fields(self)
            if getattr(self, f.name) is not None
        }

    @classmethod
    def from_numpy(cls, arrays: Mapping[str, np.ndarray]) -> "TrainBatch":
        """The batch of :meth:`to_numpy`'s arrays (zero-copy); missing or unknown fields are named."""
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in arrays and n not in OPTIONAL]
        unknown = sorted(set(arrays) - set(names))
        if missing or unknown:
            raise ValueError(
                f"TrainBatch.from_numpy: missing fields {missing}, unknown fields {unknown}; "
                f"the record's fields are {names}"
            )
        with warnings.catch_warnings():
            # Arrays from the object store are read-only; nothing writes into a batch's tensors.
            warnings.simplefilter("ignore", UserWarning)
            return cls(**{n: torch.from_numpy(arrays[n]) for n in names if n in arrays})

    # ---------------------------------------------------------------- on the actor
    def to(self, device: torch.device) -> "TrainBatch":
        """The batch on ``device`` (float fields as float32)."""
        moved: dict[str, Any] = {}
        for f in fields(self):
            if getattr(self, f.name) is None:
                continue
            value = getattr(self, f.name).to(device)
            moved[f.name] = value.float() if value.is_floating_point() else value
        return replace(self, **moved)

    def summary(self) -> dict[str, float]:
        """Plain statistics for logs (e.g. when a step is rejected): sizes, ranges, non-finite counts."""
        m = self.loss_mask
        n = int(m.sum())
        stats: dict[str, float] = {
            "batch_size": float(self.tokens.shape[0]),
            "seq_len": float(self.tokens.shape[1]),
        }
        stats["valid_tokens"] = float(n)
        for name in ("logp_mu", "advantages"):
            picked = getattr(self, name)[m]
            finite = picked[torch.isfinite(picked)]
            stats[f"{name}_nonfinite"] = float(picked.numel() - finite.numel())
            stats[f"{name}_min"] = float(finite.min()) if finite.numel() else float("nan")
            stats[f"{name}_max"] = float(finite.max()) if finite.numel() else float("nan")
        if n:
            stats["version_min"] = float(self.versions[m].min())
            stats["version_max"] = float(self.versions[m].max())
        return stats
