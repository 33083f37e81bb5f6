"""Per-token log-probs of the actual next tokens, through megatron's ``vocab_parallel_cross_entropy``.

Alignment (one convention for the whole trainer): ``logp[:, t] = log pi(tokens[:, t] | tokens[:, :t])``
for ``t >= 1``; ``logp[:, 0] = 0`` (nothing predicts the first token; it is always a prompt token
and masked). This matches the rollout record, where ``logp_mu[t]`` belongs to ``tokens[t]``.

Memory: the full logits ``[B, T, V]`` in fp32 are never materialised for the whole batch. The
decoder's final hidden states ``[T, B, H]`` are projected to the vocabulary one sequence chunk at
a time, and under autograd each chunk is checkpointed, so backward keeps only the hidden chunk and
recomputes that chunk's logits (SmolLM2's 49k vocab at B=128, T=60 would otherwise hold 1.5 GB of
logits plus the same again in softmax buffers).

Temperature: the rollout engine samples from ``softmax(logits / temperature)`` and records that
log-prob, so the actor divides the logits by the same temperature before the log-softmax.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from asyncrl.trainer.megatron.model import attention_mask, position_ids, unwrap
from asyncrl.trainer.megatron.routing_replay import replaying

DEFAULT_CHUNK_BYTES = 64 * 2**20  # fp32 logits of one chunk


def token_logprobs(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    routes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probs ``[B, T]`` (fp32) of ``tokens`` under ``model``; differentiable when grad is on.

    Args:
        model: a megatron ``GPTModel`` or its DDP wrapper (TP = 1).
        tokens: ``[B, T]`` long, right-padded.
        temperature: logits are divided by it before the log-softmax (> 0).
        max_chunk_bytes: most bytes of fp32 logits alive per chunk (at least one position).
        routes: ``[B, T, L, k]`` top-k experts of each position and MoE layer to route through (routing
            replay: trainer/megatron/routing_replay.py); None: the model's routers choose.
    """
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"tokens must be [B, T] long; got shape {tuple(tokens.shape)} dtype {tokens.dtype}")
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    B, T = tokens.shape
    if T < 2:
        return torch.zeros(B, T, dtype=torch.float32, device=tokens.device)
    gpt = unwrap(model)
    with replaying(model, routes):
        hidden = final_hidden_states(model, tokens)  # [T, B, H]
    # Hidden state at position t predicts tokens[:, t + 1].
    h = hidden[:-1]  # [T-1, B, H]
    targets = tokens[:, 1:].t().contiguous()  # [T-1, B]
    chunk = max(1, max_chunk_bytes // (B * gpt.vocab_size * 4))
    recompute = torch.is_grad_enabled() and chunk < T - 1
    pieces = []
    for start in range(0, T - 1, chunk):
        h_c, tgt_c = h[start : start + chunk], targets[start : start + chunk]
        if recompute:
            pieces.append(checkpoint(_chunk_logprobs, gpt, h_c, tgt_c, temperature, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(gpt, h_c, tgt_c, temperature))
    logp = torch.cat(pieces, dim=0).t()  # [B, T-1]
    return torch.nn.functional.pad(logp, (1, 0))  # [B, T], position 0 = 0


def final_hidden_states(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The decoder output after the final RMSNorm, ``[T, B, H]`` (megatron's sequence-first layout)."""
    B, T = tokens.shape
    with _hidden_states_only(unwrap(model)):
        return model(tokens, position_ids(B, T, tokens.device), attention_mask(model, T, tokens.device))


@contextlib.contextmanager
def _hidden_states_only(gpt: Any) -> Iterator[None]:
    # GPTModel._postprocess returns the decoder output unchanged when post_process is False (the
    # pipeline-stage path); the decoder still applies its final norm. Toggling the flag for one call
    # reuses megatron's whole forward (embedding, RoPE, decoder) without the output projection.
    saved = gpt.post_process
    gpt.post_process = False
    try:
        yield
    finally:
        gpt.post_process = saved


def _chunk_logprobs(gpt: Any, h: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[s, B]`` log-probs of ``targets`` from hidden states ``h`` ``[s, B, H]``."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    weight = gpt.shared_embedding_or_output_weight() if gpt.share_embeddings_and_output_weights else None
    logits, _ = gpt.output_layer(h, weight=weight)  # [s, B, V/TP]
    if temperature != 1.0:
        logits = logits / temperature
    # vocab_parallel_cross_entropy overwrites its input: fine, these logits are not reused.
    return -vocab_parallel_cross_entropy(logits, targets)
