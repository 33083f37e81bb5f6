"""The actor's input: one padded, per-token-aligned training batch."""

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "tokens": (torch.long,),
    "loss_mask": (torch.bool,),
    "logp_mu": (torch.float32, torch.float64),
    "versions": (torch.long,),
    "advantages": (torch.float32, torch.float64),
    "segment_ids": (torch.long,),
    "logp_ref": (torch.float32, torch.float64),
}


@dataclass(frozen=True)
class TrainBatch:
    """One right-padded batch; every tensor is ``[B, T]`` and aligned per token.

    Position ``t`` of every field describes ``tokens[:, t]``: ``logp_mu[:, t]`` is the inference
    log-prob with which ``tokens[:, t]`` was sampled, ``versions[:, t]`` the policy version that
    sampled it. Prompt, environment and padding tokens have ``loss_mask = False``.

    Attributes:
        tokens: ``[B, T]`` long token ids.
        loss_mask: ``[B, T]`` bool, True = an agent-sampled token that is trained on.
        logp_mu: ``[B, T]`` float inference-side log-prob (``mu_old``) of each sampled token.
        versions: ``[B, T]`` long version that generated each token (-1 for untrained tokens).
        advantages: ``[B, T]`` float advantage of each token (a sequence's, broadcast).
        segment_ids: ``[B, T]`` long assistant-turn id of each sampled token (-1 elsewhere).
        logp_ref: optional ``[B, T]`` float exact ``pi_old`` supplied by an old-logit strategy
            (``reference: exact``); None for every other reference.
    """

    tokens: torch.Tensor
    loss_mask: torch.Tensor
    logp_mu: torch.Tensor
    versions: torch.Tensor
    advantages: torch.Tensor
    segment_ids: torch.Tensor
    logp_ref: torch.Tensor | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.tokens.dim() != 2:
            problems.append(f"tokens must be [B, T]; got shape {tuple(self.tokens.shape)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if tuple(value.shape) != tuple(self.tokens.shape):
                problems.append(
                    f"{f.name} has shape {tuple(value.shape)}, tokens has {tuple(self.tokens.shape)}"
                )
            if value.dtype not in _DTYPES[f.name]:
                allowed = " or ".join(str(d) for d in _DTYPES[f.name])
                problems.append(f"{f.name} has dtype {value.dtype}, expected {allowed}")
        if problems:
            raise ValueError("TrainBatch: " + "; ".join(problems))

    @classmethod
    def from_fields(cls, source: Any, logp_ref: torch.Tensor | None = None) -> "TrainBatch":
        """Take the same-named ``[B, T]`` attributes of ``source`` (e.g. the driver's padded batch)."""
        names = [f.name for f in fields(cls) if f.name != "logp_ref"]
        return cls(**{n: getattr(source, n) for n in names}, logp_ref=logp_ref)

    @property
    def shape(self) -> tuple[int, int]:
        B, T = self.tokens.shape
        return B, T

    def to(self, device: torch.device) -> "TrainBatch":
        """The batch on ``device`` (float fields as float32)."""
        moved: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                value = value.to(device)
                if value.is_floating_point():
                    value = value.float()
            moved[f.name] = value
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
        for name in ("logp_mu", "advantages", "logp_ref"):
            value = getattr(self, name)
            if value is None:
                continue
            picked = value[m]
            finite = picked[torch.isfinite(picked)]
            stats[f"{name}_nonfinite"] = float(picked.numel() - finite.numel())
            stats[f"{name}_min"] = float(finite.min()) if finite.numel() else float("nan")
            stats[f"{name}_max"] = float(finite.max()) if finite.numel() else float("nan")
        if n:
            stats["version_min"] = float(self.versions[m].min())
            stats["version_max"] = float(self.versions[m].max())
        return stats
