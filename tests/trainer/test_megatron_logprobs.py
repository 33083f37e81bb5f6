"""Per-token log-probs through vocab_parallel_cross_entropy: alignment, temperature, chunking."""

import pytest
import torch

from asyncrl.api.model_arch import LlamaArch
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.logprobs import token_logprobs
from asyncrl.trainer.megatron.model import build_gpt_model
from tests.support.megatron_parts import full_logits

ARCH = LlamaArch(64, 2, 4, 2, 96, 40, 32, tie_embeddings=True)


@pytest.fixture(scope="module")
def gpt() -> torch.nn.Module:
    compat.init_megatron(seed=0, device="cpu")
    torch.manual_seed(5)
    return build_gpt_model(ARCH, init_std=0.1)


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, ARCH.vocab_size, (4, 20), generator=torch.Generator().manual_seed(6))


def _naive(gpt: torch.nn.Module, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Full log_softmax over the vocabulary, gathered at the next token; position 0 = 0."""
    logp_all = torch.log_softmax(full_logits(gpt, tokens) / temperature, dim=-1)  # [B, T, V]
    picked = logp_all[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [B, T-1]
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equals_naive_log_softmax_gather(gpt, tokens, temperature: float) -> None:
    with torch.no_grad():
        got = token_logprobs(gpt, tokens, temperature=temperature)
        expected = _naive(gpt, tokens, temperature)
    assert got.shape == tokens.shape and got.dtype == torch.float32
    assert torch.all(got[:, 0] == 0.0)
    # Measured <= 4.8e-7 (measured here); both sides are fp32 over the same logits.
    torch.testing.assert_close(got, expected, rtol=0.0, atol=2e-6)


def test_temperature_changes_the_distribution(gpt, tokens) -> None:
    with torch.no_grad():
        assert not torch.allclose(token_logprobs(gpt, tokens), token_logprobs(gpt, tokens, temperature=0.5))


def test_chunked_matches_unchunked_values_and_gradients(gpt, tokens) -> None:
    # 1 position per chunk (4 rows x 40 vocab x 4 bytes = 640 bytes) against one chunk for all 19.
    results = []
    for chunk_bytes in (640, 2**30):
        gpt.zero_grad(set_to_none=True)
        logp = token_logprobs(gpt, tokens, temperature=0.7, max_chunk_bytes=chunk_bytes)
        (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        grads = {n: p.grad.clone() for n, p in gpt.named_parameters()}
        results.append((logp.detach(), grads))
    (lp_small, g_small), (lp_big, g_big) = results
    torch.testing.assert_close(lp_small, lp_big, rtol=0.0, atol=1e-6)
    assert (
        g_small.keys() == g_big.keys() and len(g_small) == 14
    )  # 1 + 2 layers x 6 + final norm; tied: no output_layer
    for name in g_small:
        torch.testing.assert_close(g_small[name], g_big[name], rtol=1e-5, atol=1e-6, msg=name)
    gpt.zero_grad(set_to_none=True)


def test_rejects_bad_input(gpt) -> None:
    with pytest.raises(ValueError, match=r"\[B, T\] long; got shape \(20,\)"):
        token_logprobs(gpt, torch.zeros(20, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(gpt, torch.zeros(2, 5, dtype=torch.long), temperature=0.0)
