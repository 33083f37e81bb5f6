"""A LoRA actor's checkpoint: the adapters and their optimizer state in the sharded format, no base weights,
a resume that continues exactly, and a resume onto another base refused."""

import dataclasses
from pathlib import Path

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from tests.support.hf_models import folder_arch, tiny_folder

B, T, PROMPT = 4, 12, 3

pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lora-ckpt")


def _actor(folder: Path | None, lora: bool = True) -> MegatronActor:
    model: dict = {"weights": str(folder)} if folder is not None else {"preset": "tiny-llama", "hiddenSize": 32,
                                                                        "numLayers": 1, "ffnHiddenSize": 64}
    if lora:
        model["lora"] = {"rank": 2}
    spec = AsyncRLJobSpec.model_validate({
        "correction": {"reference": "ewma"}, "model": model, "train": {"learningRate": 5e-2, "seed": 3}})
    vocab = folder_arch(folder).vocab_size if folder is not None else 40
    return MegatronActor.from_spec(spec, vocab, num_threads=torch.get_num_threads())


def _batch(actor: MegatronActor, seed: int) -> TrainBatch:
    vocab = actor.settings.arch.vocab_size
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, PROMPT:] = True
    adv = torch.tensor([1.0, -1.0] * (B // 2))[:, None].expand(B, T).contiguous()
    batch = TrainBatch(tokens, mask, torch.zeros(B, T), torch.where(mask, 0, -1), adv, torch.where(mask, 0, -1))
    return dataclasses.replace(batch, logp_mu=actor.logprobs(tokens) * mask,
                               versions=torch.where(mask, actor.version, -1))


def test_resume_continues_the_adapters_and_their_optimizer_and_holds_no_base(root: Path, tmp_path: Path) -> None:
    folder = tiny_folder(root, "llama")
    first = _actor(folder)
    assert first.train_step(_batch(first, 1)).applied
    first.save_checkpoint(str(tmp_path / "ckpt"))
    stored = sum(f.stat().st_size for f in (tmp_path / "ckpt").rglob("*") if f.is_file())
    base = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    print(f"checkpoint {stored} bytes, base weights {base} bytes")
    assert stored < base  # the adapters, their moments and EWMA copy: no base weights
    second = _actor(folder)
    second.load_checkpoint(str(tmp_path / "ckpt"))
    assert second.version == first.version == 1
    for k, v in first.named_weights().items():
        assert torch.equal(second.named_weights()[k], v), k
    batch = _batch(first, 2)
    a, b = first.train_step(batch), second.train_step(batch)  # Adam's moments restored: the same update
    assert a.loss == b.loss and a.grad_norm == b.grad_norm
    for k, v in first.named_weights().items():
        assert torch.equal(second.named_weights()[k], v), k


def test_resume_onto_another_base_or_without_lora_is_refused(root: Path, tmp_path: Path) -> None:
    first = _actor(tiny_folder(root, "llama"))
    first.save_checkpoint(str(tmp_path / "ckpt"))
    other = tiny_folder(root / "other", "llama", seed=7)  # the same architecture, other weights
    with pytest.raises(ValueError, match="trained on base sha256:.*resume with the base folder"):
        _actor(other).load_checkpoint(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="holds LoRA adapters, not full weights"):
        _actor(tiny_folder(root, "llama"), lora=False).load_checkpoint(str(tmp_path / "ckpt"))
    full = _actor(None, lora=False)
    full.save_checkpoint(str(tmp_path / "full"))
    with pytest.raises(ValueError, match="holds no LoRA adapters"):
        _actor(None).load_checkpoint(str(tmp_path / "full"))
