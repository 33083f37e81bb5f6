"""``asyncrl export``: a checkpoint -> an HF folder that transformers loads with the actor's logits."""

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from asyncrl.api.job import AsyncRLJob
from asyncrl.api.validation import validate_job
from asyncrl.rollout.tokenizer import TOKENIZER
from asyncrl.trainer import export
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.cli import main
from asyncrl.trainer.driver.run import export as run_export
from tests.support.hf_models import ALL_FAMILIES, tiny_folder
from tests.support.megatron_parts import full_logits

VERSION = 3


pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def _job(tmp: Path, *, tied: bool = True, weights: str | None = None, task: str = "calculator") -> AsyncRLJob:
    model: dict = {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 2, "ffnHiddenSize": 64,
                   "tieEmbeddings": tied}
    if weights is not None:
        model["weights"] = weights
    return validate_job({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "exp"},
                         "spec": {"model": model, "task": {"name": task, "temperature": 0.8},
                                  "train": {"seed": 5}}}, "job.yaml")


def _run_dir(tmp: Path, job: AsyncRLJob, *, versions: tuple[int, ...] = (VERSION,)) -> tuple[Path, MegatronActor]:
    """A run directory as ``asyncrl run`` leaves it: job.yaml and checkpoints/step-NNNNNN (actor checkpoints)."""
    run = tmp / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "job.yaml").write_text(yaml.safe_dump(job.model_dump(mode="json", by_alias=True)))
    files = export.model_files(job.spec)
    actor = MegatronActor.from_spec(job.spec, files.tokenizer.vocab_size,
                                    max_sequence_length=files.arch.max_sequence_length)
    with torch.no_grad():  # non-trivial norms, so a dropped or swapped norm shows in the logits
        for name, p in actor._gpt.named_parameters():
            if "layernorm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    for v in versions:
        actor.version = v
        actor.save_checkpoint(str(run / "checkpoints" / f"step-{v:06d}"))
    return run, actor


def _tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (3, 20), generator=torch.Generator().manual_seed(1))


def _hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return model.eval()(tokens).logits


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_export_of_a_run_dir_loads_in_transformers_with_the_actors_logits(tmp_path: Path, tied: bool) -> None:
    job = _job(tmp_path, tied=tied)
    run, actor = _run_dir(tmp_path, job, versions=(1, VERSION))
    with torch.no_grad():
        for p in actor._gpt.parameters():  # the live actor moves on: the export is of the checkpoint
            p.add_(1.0)
    result = run_export.export_checkpoint(run, tmp_path / "out")
    assert result.version == VERSION  # the newest of the two checkpoints
    fresh = MegatronActor.from_spec(job.spec, TOKENIZER.vocab_size,
                                    max_sequence_length=actor.settings.arch.max_sequence_length)
    fresh.load_checkpoint(str(run / "checkpoints" / f"step-{VERSION:06d}"))
    tokens = _tokens(TOKENIZER.vocab_size)
    with torch.no_grad():
        want = full_logits(fresh._gpt, tokens)
    got = _hf_logits(tmp_path / "out", tokens)
    assert got.shape == want.shape == (3, 20, TOKENIZER.vocab_size)
    torch.testing.assert_close(got, want, rtol=0.0, atol=1e-6)
    files = set(os.listdir(tmp_path / "out"))
    assert {"config.json", "generation_config.json", export.INDEX_FILE, "model-00001-of-00001.safetensors",
            "tokenizer.json", "tokenizer_config.json", export.MARKER_FILE} <= files
    index = json.loads((tmp_path / "out" / export.INDEX_FILE).read_text())
    assert ("lm_head.weight" in index["weight_map"]) is (not tied)  # a tied head is the embedding
    gen = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert gen["temperature"] == 0.8 and gen["eos_token_id"] == TOKENIZER.eos_id


def test_sharded_export_splits_at_the_shard_size_and_loads(tmp_path: Path) -> None:
    job = _job(tmp_path)
    run, actor = _run_dir(tmp_path, job)
    # tiny-llama at hidden 32: the largest tensor is fc1/gate [64, 32] fp32 = 8 KiB; 10 kB shards hold one or two
    result = run_export.export_checkpoint(run / "checkpoints" / f"step-{VERSION:06d}", tmp_path / "out",
                                      max_shard_bytes=export.parse_size("10kB"))
    shards = list(export.iter_shards(tmp_path / "out"))
    assert result.shards == len(shards) > 3
    from safetensors import safe_open

    for path in shards:
        with safe_open(str(path), "pt") as f:
            sizes = [f.get_tensor(k).numel() * 4 for k in f.keys()]  # noqa: SIM118 -- safe_open has no iterator
        assert sum(sizes) <= 10_000 or len(sizes) == 1
    tokens = _tokens(TOKENIZER.vocab_size)
    with torch.no_grad():
        want = full_logits(actor._gpt, tokens)
    torch.testing.assert_close(_hf_logits(tmp_path / "out", tokens), want, rtol=0.0, atol=1e-6)


def test_character_tokenizer_is_written_as_an_hf_tokenizer_with_the_same_ids(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    run, _ = _run_dir(tmp_path, _job(tmp_path))
    result = run_export.export_checkpoint(run, tmp_path / "out")
    assert "character tokenizer" in result.tokenizer
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    text = "Q:12*(3-4)=?<calc>12*(3-4)</calc><res>-12</res><ans>-12</ans><eos>"
    assert hf.encode(text, add_special_tokens=False) == TOKENIZER.encode(text)
    assert hf.decode(TOKENIZER.encode(text)) == text
    assert (hf.pad_token_id, hf.eos_token_id, hf.bos_token_id) == (TOKENIZER.pad_id, TOKENIZER.eos_id, TOKENIZER.bos_id)
    assert list(hf.apply_chat_template([{"role": "user", "content": "Q:1+2=?"}], tokenize=True)["input_ids"]) == \
        TOKENIZER.chat_prompt("", "Q:1+2=?")
    # the last user turn wherever it is: a conversation that goes on after it renders the same prompt
    assert list(hf.apply_chat_template([{"role": "user", "content": "Q:1+2=?"}, {"role": "assistant", "content": "3"}],
                                       tokenize=True)["input_ids"]) == TOKENIZER.chat_prompt("", "Q:1+2=?")
    # the math tasks' prompt: a system text and worked examples before the question, all left out as the
    # character tokenizer leaves them out (a run continued from the export sees the prompts it was trained on)
    from asyncrl.rollout.envs.math_tasks import EXAMPLES_TOOL, SYSTEM_TOOL
    from asyncrl.rollout.tokenizer import HFTokenizer

    assert HFTokenizer.from_folder(tmp_path / "out").chat_prompt(SYSTEM_TOOL, "Q:1+2=?", EXAMPLES_TOOL) == \
        TOKENIZER.chat_prompt(SYSTEM_TOOL, "Q:1+2=?", EXAMPLES_TOOL) == TOKENIZER.encode("Q:1+2=?", bos=True)


def test_a_customer_service_run_exports_the_tasks_bpe_and_template_for_transformers(tmp_path: Path) -> None:
    """A preset model on the customer-service task reads it through the task's BPE (no model folder): the
    export saves that tokenizer, and transformers renders the task's prompt to the ids the policy saw."""
    import random

    from transformers import AutoTokenizer

    from asyncrl.rollout.envs.cs_tokenizer import cs_tokenizer
    from asyncrl.rollout.envs.customer_service import CustomerService, draw_scenario
    from asyncrl.rollout.envs.render import render_prompt
    from asyncrl.rollout.tokenizer import HFTokenizer

    job = _job(tmp_path, task="customer-service")
    run, actor = _run_dir(tmp_path, job)  # an untrained checkpoint: the tokenizer and the weights are what's checked
    out = tmp_path / "out"
    result = run_export.export_checkpoint(run, out)
    assert "save_pretrained" in result.tokenizer and "chat template" in result.tokenizer, result.tokenizer
    assert json.loads((out / export.MARKER_FILE).read_text())["tokenizer"] == result.tokenizer
    task_tok = cs_tokenizer()
    hf = AutoTokenizer.from_pretrained(str(out))
    assert len(hf) == task_tok.vocab_size
    assert (hf.pad_token_id, hf.eos_token_id) == (task_tok.pad_id, task_tok.eos_id)
    again = HFTokenizer.from_folder(out)  # a job that starts from the export (spec.model.weights: out)
    assert (again.eos_id, again.pad_id, again.stop_ids) == (task_tok.eos_id, task_tok.pad_id, task_tok.stop_ids)
    for seed in range(3):
        reset = CustomerService().reset(draw_scenario(random.Random(seed)).to_sample())
        want = render_prompt(task_tok, reset.messages, reset.tools)  # what the rollout worker feeds the policy
        got = hf.apply_chat_template(list(reset.messages), tools=[dict(t) for t in reset.tools or ()],
                                     add_generation_prompt=True, tokenize=True)["input_ids"]
        assert list(got) == want == render_prompt(again, reset.messages, reset.tools)
        assert hf.decode(want) == task_tok.decode(want)
    tokens = torch.tensor([want])
    with torch.no_grad():
        want_logits = full_logits(actor._gpt, tokens)
    torch.testing.assert_close(_hf_logits(out, tokens), want_logits, rtol=0.0, atol=1e-6)


def test_a_tokenizer_with_nothing_to_save_is_refused_naming_the_field(tmp_path: Path) -> None:
    class Bare:  # a Tokenizer-protocol object with neither a folder nor a transformers tokenizer behind it
        name, vocab_size, pad_id, eos_id = "bare", 4, 0, 1

    files = export.ModelFiles(export.model_files(_job(tmp_path).spec).arch, Bare(), None, 1.0)
    with pytest.raises(export.ExportError, match=r"'bare' has no files to copy.*set spec\.model\.weights"):
        export.write_tokenizer(files, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_leaves_no_partial_folder_and_keeps_the_previous_export(tmp_path: Path) -> None:
    from tests.support.filesystems import fill, small_filesystem

    run, _ = _run_dir(tmp_path, _job(tmp_path))
    with small_filesystem(tmp_path / "fs", 2) as fs:
        out = fs / "out"
        first = run_export.export_checkpoint(run, out)
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        filler = fill(fs, first.weight_bytes // 2)  # half the weights fit: a real ENOSPC mid-way
        with pytest.raises(export.ExportError, match=r"No space left on device.*nothing was written to --out"):
            run_export.export_checkpoint(run, out, overwrite=True, max_shard_bytes=export.parse_size("8kB"))
        assert sorted(os.listdir(fs)) == ["filler.bin", "out"]  # the temporary folder is gone
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the previous export, untouched
        filler.unlink()
        assert run_export.export_checkpoint(run, out, overwrite=True).version == VERSION
    with pytest.raises(export.ExportError, match="exists; choose another --out or pass --force"):
        run_export.export_checkpoint(run, tmp_path / "run")


def test_the_source_folders_files_are_what_the_export_carries(tmp_path: Path) -> None:
    import shutil

    source = tmp_path / "model"
    shutil.copytree(tiny_folder(tmp_path / "families", "llama"), source)
    (source / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "temperature": 0.7}))
    job = validate_job({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "exp"},
                        "spec": {"model": {"weights": str(source)}, "task": {"name": "calculator"}}}, "job.yaml")
    run, _ = _run_dir(tmp_path, job)
    result = run_export.export_checkpoint(run, tmp_path / "out", dtype="bfloat16")
    assert result.config_source == "source folder"
    out = tmp_path / "out"
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"  # the export's, not the source's
    assert json.loads((out / "generation_config.json").read_text()) == {"eos_token_id": 2, "temperature": 0.7}
    assert {k: v for k, v in json.loads((out / "config.json").read_text()).items() if k not in ("dtype", "torch_dtype")} \
        == {k: v for k, v in json.loads((source / "config.json").read_text()).items() if k not in ("dtype", "torch_dtype")}


def test_weights_that_do_not_fit_the_architecture_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _, actor = _run_dir(tmp_path, job)
    hf = actor.hf_state_dict()
    hf.pop("model.norm.weight")
    hf["model.layers.0.mlp.up_proj.weight"] = hf["model.layers.0.mlp.up_proj.weight"][:3]
    with pytest.raises(export.ExportError) as err:
        export.write_hf_folder(hf, export.model_files(job.spec), tmp_path / "out", version=1)
    assert "missing model.norm.weight [32]" in str(err.value)
    assert "model.layers.0.mlp.up_proj.weight: [3, 32], expected [64, 32]" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_training_exports_keep_the_newest_n(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _, actor = _run_dir(tmp_path, job)
    files = export.model_files(job.spec)
    root = tmp_path / "ckpt"
    (root / export.EXPORTS_DIR / ".step-000009.tmp-1").mkdir(parents=True)  # a crashed export's leftovers
    weights = {k: v.numpy() for k, v in actor.hf_state_dict().items()}
    for v in (2, 4, 6, 8):
        result = export.export_weights(weights, files, root, v, job_name="exp", keep=2)
        assert result.path == export.export_path(root, v)
    assert [v for v, _ in export.complete_exports(root)] == [6, 8]
    assert json.loads((export.export_path(root, 8) / export.MARKER_FILE).read_text())["version"] == 8


def test_cli_exports_and_prints_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = _run_dir(tmp_path, _job(tmp_path))
    assert main(["export", str(run), "--out", str(tmp_path / "out"), "--max-shard-size", "20kB"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["path"] == str(tmp_path / "out") and last["version"] == VERSION and last["shards"] > 1
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 2  # exists, no --force
    assert "pass --force" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o2")]) == 2
    assert "no such run directory or checkpoint" in capsys.readouterr().err
    bare = tmp_path / "bare"
    bare.mkdir()
    assert main(["export", str(bare), "--out", str(tmp_path / "o3")]) == 2
    assert "pass the job the checkpoint was trained with" in capsys.readouterr().err


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("families")


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_each_family_exports_to_a_folder_transformers_loads_with_the_actors_logits(
        family: str, family_folders: Path, tmp_path: Path) -> None:
    source = tiny_folder(family_folders, family)  # type: ignore[arg-type]
    job = validate_job({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "fam"},
                        "spec": {"model": {"weights": str(source)}, "task": {"name": "calculator"}}}, "job.yaml")
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.yaml").write_text(yaml.safe_dump(job.model_dump(mode="json", by_alias=True)))
    files = export.model_files(job.spec)
    actor = MegatronActor.from_spec(job.spec, files.tokenizer.vocab_size,
                                    max_sequence_length=files.arch.max_sequence_length)
    with torch.no_grad():  # trained away from the folder's weights: the export must be the checkpoint's
        for p in actor._gpt.parameters():
            p.add_(0.01 * torch.randn_like(p))
    actor.version = VERSION
    actor.save_checkpoint(str(run / "checkpoints" / f"step-{VERSION:06d}"))
    result = run_export.export_checkpoint(run, tmp_path / "out", max_shard_bytes=export.parse_size("100kB"))
    assert result.config_source == "source folder" and result.tokenizer.startswith(f"copied from {source}")
    from safetensors import safe_open

    # the round trip: the files hold exactly the actor's weights at the checkpoint, through the family's converter
    want_tensors = {k: v for k, v in actor.hf_state_dict().items()
                    if not (files.arch.tie_embeddings and k == "lm_head.weight")}
    written: dict[str, torch.Tensor] = {}
    for shard in export.iter_shards(tmp_path / "out"):
        with safe_open(str(shard), "pt") as f:
            written |= {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 -- safe_open has no iterator
    assert written.keys() == want_tensors.keys()
    assert all(torch.equal(written[k], v) for k, v in want_tensors.items())
    tokens = _tokens(files.tokenizer.vocab_size)
    with torch.no_grad():
        want = full_logits(actor._gpt, tokens)
    got = _hf_logits(tmp_path / "out", tokens)
    diff = float((got - want).abs().max())
    print(f"\n{family}: {result.shards} shards, max |logits - actor's| {diff:.2e}")
    # from_pretrained's logits against the Megatron actor's: the two model codes' fp32 agreement, measured 0.0
    # for Llama, Mistral and Qwen2 and up to 2.2e-6 for the QK-norm families (the folder's own weights show the
    # same; the converter's parity bound is 1e-5)
    torch.testing.assert_close(got, want, rtol=0.0, atol=1e-6 if family in ("llama", "mistral", "qwen2") else 1e-5)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == json.loads((source / "config.json").read_text())["architectures"]
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (source / name).read_bytes(), name


def test_a_corrupt_newest_checkpoint_is_skipped_and_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = _run_dir(tmp_path, _job(tmp_path), versions=(1, VERSION))
    newest = run / "checkpoints" / f"step-{VERSION:06d}"
    with open(newest / "common.pt", "r+b") as f:  # a torn write: the recorded size no longer matches
        f.truncate(100)
    assert main(["export", str(run), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["version"] == 1
    assert f"{newest} skipped:" in captured.err
    assert main(["export", str(newest), "--out", str(tmp_path / "o2")]) == 2  # asked for by name: refused
    assert "export another checkpoint folder" in capsys.readouterr().err


def test_the_final_export_reaches_the_status_and_the_console() -> None:
    from asyncrl.trainer.cli.console import format_summary
    from asyncrl.trainer.driver.run.summary import RunSummary
    from asyncrl.trainer.driver.status.reporter import StatusReporter
    from tests.trainer.test_driver_status_reporter import step

    patches: list[dict] = []
    reporter = StatusReporter(patches.append)
    reporter(step(1, checkpoint="/ckpt/step-000001"))
    reporter(step(2, export="/ckpt/exports/step-000002"))
    assert reporter.flush()
    training = patches[-1]["status"]["training"]
    assert (training["lastExport"], training["lastExportVersion"]) == ("/ckpt/exports/step-000002", 2)
    assert (training["lastCheckpoint"], training["lastCheckpointVersion"]) == ("/ckpt/step-000001", 1)
    text = format_summary(RunSummary.from_json({"job": "j", "status": "succeeded", "export": {
        "path": "/ckpt/exports/step-000002", "version": 2}}))
    assert "exported: /ckpt/exports/step-000002 (version 2;" in text
