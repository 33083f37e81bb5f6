"""``asyncrl export`` of a LoRA run: the peft adapter folder that peft loads onto the base folder gives the
actor's logits; ``--merged`` writes a full HF folder with the same logits; a preset base is refused."""

from pathlib import Path

import pytest
import torch

from asyncrl.api.job import AsyncRLJob
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.driver.run.export import export_checkpoint
from asyncrl.trainer.export import ExportError, model_files
from tests.support.hf_models import folder_arch, tiny_folder, tokens, transformers_model
from tests.support.megatron_parts import full_logits

pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def _job(folder: Path | None) -> AsyncRLJob:
    model: dict = {"weights": str(folder)} if folder is not None else {"preset": "tiny-llama"}
    model["lora"] = {"rank": 4, "alpha": 8.0}
    return AsyncRLJob.model_validate({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob",
                                      "metadata": {"name": "lora"}, "spec": {"model": model, "train": {"seed": 2}}})


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, AsyncRLJob, torch.Tensor, torch.Tensor]:
    """A checkpoint of a LoRA actor whose adapters are non-zero (B drawn: B = 0 would export the base)."""
    root = tmp_path_factory.mktemp("lora-export")
    folder = tiny_folder(root, "qwen2")
    job = _job(folder)
    files = model_files(job.spec)  # the actor as the run builds it (the task's context length)
    actor = MegatronActor.from_spec(job.spec, files.tokenizer.vocab_size, num_threads=torch.get_num_threads(),
                                    max_sequence_length=files.arch.max_sequence_length)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in actor.named_weights().values():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    ids = tokens(folder_arch(folder).vocab_size)
    with torch.no_grad():
        logits = full_logits(actor.gpt, ids)
    actor.save_checkpoint(str(root / "ckpt"))
    return root, folder, job, ids, logits


def test_the_peft_folder_loaded_by_peft_gives_the_actors_logits(trained, tmp_path: Path) -> None:
    from peft import PeftModel

    root, folder, job, ids, actor_logits = trained
    result = export_checkpoint(root / "ckpt", tmp_path / "adapter", job=job)
    assert sorted(result.files) == ["adapter_config.json", "adapter_model.safetensors", "asyncrl-export.json"]
    model = PeftModel.from_pretrained(transformers_model(folder), str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        got = model(ids).logits
        base = model.get_base_model()
        with model.disable_adapter():
            plain = base(ids).logits
    print(f"max|peft - actor| {(got - actor_logits).abs().max().item():.2e}")
    torch.testing.assert_close(got, actor_logits, rtol=0.0, atol=2e-5)
    assert (plain - actor_logits).abs().max() > 1e-2  # the adapters matter: the test could fail


def test_merged_writes_a_full_folder_with_the_actors_logits(trained, tmp_path: Path) -> None:
    root, _, job, ids, actor_logits = trained
    export_checkpoint(root / "ckpt", tmp_path / "merged", job=job, merged=True)
    with torch.no_grad():
        got = transformers_model(tmp_path / "merged")(ids).logits
    torch.testing.assert_close(got, actor_logits, rtol=0.0, atol=2e-5)


def test_a_preset_base_cannot_be_exported(trained, tmp_path: Path) -> None:
    root, _, _, _, _ = trained
    with pytest.raises(ExportError, match="needs spec.model.weights"):
        export_checkpoint(root / "ckpt", tmp_path / "x", job=_job(None))
