"""The brute-force reference of exact old logits (issue 8 §5), for every strategy's tests.

For each version a *fresh* megatron ``GPTModel`` is built, that version's weights are loaded into it
(``load_state_dict(strict=True)``, the way a checkpoint is loaded) and it recomputes the log-probs of
the tokens that version generated. Nothing is shared with the code under test but the model code and
the log-prob convention, so a provider that scores a token under the wrong version, or leaks weights
between versions, disagrees with it.

Weights are HF Llama-named, as rollout receives them (``MegatronActor.hf_state_dict()``): a test
records them at each version and compares any strategy's ``logp_old`` with :func:`brute_force_logp_old`.
Call ``asyncrl.trainer.megatron.compat.init_megatron(seed, device="cpu")`` first (once per process).
"""

from collections.abc import Mapping

import torch
from torch import Tensor

from asyncrl.api.model_arch import LlamaArch
from asyncrl.trainer.megatron.convert import hf_to_megatron
from asyncrl.trainer.megatron.logprobs import token_logprobs
from asyncrl.trainer.megatron.model import build_gpt_model

HfWeights = Mapping[str, Tensor]


def fresh_model_logprobs(arch: LlamaArch, weights: HfWeights, tokens: Tensor, *, temperature: float = 1.0) -> Tensor:
    """``[b, T]`` fp32 log-probs of ``tokens`` ``[b, T]`` under a new model loaded with ``weights``."""
    gpt = build_gpt_model(arch)  # random init, then every parameter overwritten (strict load)
    gpt.load_state_dict(hf_to_megatron(dict(weights), arch), strict=True)
    gpt.eval()
    with torch.no_grad():
        return token_logprobs(gpt, tokens.cpu(), temperature=temperature).float()


def brute_force_logp_old(
    arch: LlamaArch,
    weights_by_version: Mapping[int, HfWeights],
    tokens: Tensor,
    versions: Tensor,
    loss_mask: Tensor,
    *,
    temperature: float = 1.0,
) -> Tensor:
    """``pi_old`` ``[B, T]`` (fp32): each ``loss_mask`` token under a fresh model of its own version, 0 elsewhere.

    Args:
        weights_by_version: HF-named weights of every version present under ``loss_mask``.
        tokens, versions: ``[B, T]`` long; loss_mask: ``[B, T]`` bool.

    Raises:
        KeyError: a trained token's version has no weights here (the test forgot to record it).
    """
    if not (tokens.shape == versions.shape == loss_mask.shape):
        raise ValueError(f"tokens {tuple(tokens.shape)}, versions {tuple(versions.shape)}, loss_mask "
                         f"{tuple(loss_mask.shape)} must all be [B, T]")
    out = torch.zeros(tokens.shape, dtype=torch.float32)
    needed = sorted({int(v) for v in versions[loss_mask].tolist()})
    absent = [v for v in needed if v not in weights_by_version]
    if absent:
        raise KeyError(f"brute force: no weights recorded for versions {absent}; recorded: {sorted(weights_by_version)}")
    for v in needed:
        sel = (loss_mask & (versions == v)).cpu()
        logp = fresh_model_logprobs(arch, weights_by_version[v], tokens, temperature=temperature)
        out = torch.where(sel, logp, out)
    return out
