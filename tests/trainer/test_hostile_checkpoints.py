"""A checkpoint folder is data, never code: every row of ``HOSTILE_FOLDERS`` (a real sealed folder with one
thing changed and its marker resealed with correct checksums) is refused with one line naming the file, by
the gate every load passes (``verified``), by a resume and by ``asyncrl export``; a row whose payload would
run a command leaves no trace of it (its canary file never appears). The untouched folder loads and
exports bit for bit (so the table's refusals come from the change, not the base)."""

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from asyncrl.api.job import AsyncRLJob
from asyncrl.api.validation import validate_job
from asyncrl.trainer.actor.checkpoint_io import load_actor
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.checkpoint import safe_load
from asyncrl.trainer.checkpoint import sharded as sharded_checkpoint
from asyncrl.trainer.checkpoint.folder import CheckpointError
from asyncrl.trainer.cli import main
from asyncrl.trainer.megatron.model import build_gpt_model
from tests.support.hostile_checkpoints import HOSTILE_FOLDERS, HostileFolder

VERSION = 3
STEP = f"step-{VERSION:06d}"
CODE_ROWS = [c for c in HOSTILE_FOLDERS if c.runs_code]


pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def _job() -> AsyncRLJob:
    return validate_job({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "exp"},
                         "spec": {"model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1,
                                            "ffnHiddenSize": 64},
                                  "task": {"name": "calculator"}, "train": {"seed": 5}}}, "job.yaml")


def _actor(job: AsyncRLJob) -> MegatronActor:
    from asyncrl.trainer import export

    files = export.model_files(job.spec)
    return MegatronActor.from_spec(job.spec, files.tokenizer.vocab_size,
                                   max_sequence_length=files.arch.max_sequence_length)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, MegatronActor]:
    """A run directory with one sealed sharded checkpoint (never changed: each test copies it)."""
    run = tmp_path_factory.mktemp("base") / "run"
    (run / "checkpoints").mkdir(parents=True)
    job = _job()
    (run / "job.yaml").write_text(yaml.safe_dump(job.model_dump(mode="json", by_alias=True)))
    actor = _actor(job)
    actor.version = VERSION
    actor.save_checkpoint(str(run / "checkpoints" / STEP))
    return run, actor


def _hostile(base: tuple[Path, MegatronActor], case: HostileFolder, tmp: Path) -> tuple[Path, Path, Path]:
    """(run directory, its changed checkpoint folder, the canary a payload would create)."""
    run = tmp / "run"
    shutil.copytree(base[0], run, symlinks=True)
    folder = run / "checkpoints" / STEP
    canary = tmp / "ran"
    case.mutate(folder, canary)
    return run, folder, canary


def _refusal(case: HostileFolder, text: str) -> None:
    assert case.file in text and case.message in text, text
    assert "Traceback" not in text


def test_the_untouched_folder_verifies_loads_and_exports(base: tuple[Path, MegatronActor], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(base[0], run)
    folder = run / "checkpoints" / STEP
    assert sharded_checkpoint.verified(folder)["version"] == VERSION
    fresh = _actor(_job())
    with torch.no_grad():
        for p in fresh._params:
            p.add_(1.0)
    load_actor(fresh, str(folder))
    assert all(torch.equal(a, b) for a, b in zip(fresh._params, base[1]._params, strict=True))
    assert main(["export", str(run), "--out", str(tmp_path / "out"), "--quiet"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("case", HOSTILE_FOLDERS, ids=[c.id for c in HOSTILE_FOLDERS])
def test_the_gate_refuses_it_naming_the_file(base: tuple[Path, MegatronActor], case: HostileFolder,
                                             tmp_path: Path) -> None:
    _, folder, canary = _hostile(base, case, tmp_path)
    with pytest.raises(CheckpointError) as err:
        sharded_checkpoint.verified(folder)
    _refusal(case, str(err.value))
    assert not canary.exists()


@pytest.mark.parametrize("case", HOSTILE_FOLDERS, ids=[c.id for c in HOSTILE_FOLDERS])
def test_a_resume_refuses_it_and_runs_nothing(base: tuple[Path, MegatronActor], case: HostileFolder,
                                              tmp_path: Path) -> None:
    _, folder, canary = _hostile(base, case, tmp_path)
    actor = _actor(_job())
    before = [p.detach().clone() for p in actor._params]
    with pytest.raises(CheckpointError) as err:
        load_actor(actor, str(folder))
    _refusal(case, str(err.value))
    assert not canary.exists()
    assert all(torch.equal(a, b) for a, b in zip(actor._params, before, strict=True))  # nothing half-loaded


@pytest.mark.parametrize("case", HOSTILE_FOLDERS, ids=[c.id for c in HOSTILE_FOLDERS])
def test_asyncrl_export_refuses_it_and_runs_nothing(base: tuple[Path, MegatronActor], case: HostileFolder,
                                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, folder, canary = _hostile(base, case, tmp_path)
    out = tmp_path / "out"
    assert main(["export", str(folder), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one line
    _refusal(case, err)
    assert not canary.exists() and not out.exists()


@pytest.mark.parametrize("case", CODE_ROWS, ids=[c.id for c in CODE_ROWS])
def test_megatrons_own_reads_refuse_a_payload_past_the_gate(base: tuple[Path, MegatronActor], case: HostileFolder,
                                                            tmp_path: Path) -> None:
    """A file swapped after the gate checked it: megatron's reads go through the same unpicklers (the shims)."""
    _, folder, canary = _hostile(base, case, tmp_path)
    gpt = build_gpt_model(base[1].settings.arch, use_cpu_initialization=True, random_init=False)
    with pytest.raises(safe_load.UnsafeCheckpointError) as err:
        sharded_checkpoint.load_model(folder, gpt)  # straight to dist_checkpointing, no verified()
    assert "needs full unpickling" in str(err.value) or "names the global" in str(err.value)
    assert not canary.exists()


def test_the_metadata_unpickler_admits_what_a_real_folder_names_and_nothing_else(
        base: tuple[Path, MegatronActor]) -> None:
    import io
    import pickletools

    data = (base[0] / "checkpoints" / STEP / ".metadata").read_bytes()
    safe_load.read_metadata(base[0] / "checkpoints" / STEP / ".metadata")  # loads
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert "STACK_GLOBAL" in ops  # it does name globals: the allowlist is exercised, not bypassed
    for module, name in (("builtins", "eval"), ("os", "system"), ("torch", "load"), ("torch.serialization", "load"),
                         ("torch.distributed.checkpoint.metadata", "Metadata.__init__")):
        with pytest.raises(safe_load.RefusedGlobal, match=f"^{module}.{name}$"):
            safe_load.MetadataUnpickler(io.BytesIO()).find_class(module, name)


# ------------------------------------------------------------------ set-aside folders (step-N.corrupt)
def _torn(root: Path, version: int, text: str = "torn") -> Path:
    """A step folder a crash left without its marker (never resumable)."""
    folder = root / f"step-{version:06d}"
    folder.mkdir(parents=True)
    (folder / "common.pt").write_text(text)
    return folder


def test_set_aside_folders_are_kept_up_to_the_limit_and_then_pruned(tmp_path: Path) -> None:
    from asyncrl.trainer.driver.run import checkpoints

    root = tmp_path / "checkpoints"
    for version in (1, 2, 3, 4, 5):
        _torn(root, version)
    (root / "step-000001.corrupt").mkdir()  # what earlier versions left: a step set aside three times
    (root / "step-000001.corrupt-2").mkdir()
    point = checkpoints.choose_resume(root)
    assert point.checkpoint is None and len(point.skipped) == 5
    # 5 set aside now + 2 left before = 7 candidates; the newest CORRUPT_KEEP = 3 steps stay: 3, 4, 5
    assert checkpoints.CORRUPT_KEEP == 3
    assert sorted(p.name for p in root.iterdir()) == ["step-000003.corrupt", "step-000004.corrupt",
                                                      "step-000005.corrupt"]


def test_a_step_set_aside_again_replaces_its_earlier_folder(tmp_path: Path) -> None:
    from asyncrl.trainer.driver.run import checkpoints

    root = tmp_path / "checkpoints"
    _torn(root, 7, "first")
    checkpoints.choose_resume(root)
    _torn(root, 7, "second")  # the step was trained again and torn again
    point = checkpoints.choose_resume(root)
    assert point.skipped[0].moved_to == root / "step-000007.corrupt"
    assert sorted(p.name for p in root.iterdir()) == ["step-000007.corrupt"]  # no -2
    assert (root / "step-000007.corrupt" / "common.pt").read_text() == "second"  # the newer one is kept


def test_a_set_aside_link_is_removed_not_followed(tmp_path: Path) -> None:
    from asyncrl.trainer.driver.run import checkpoints

    root = tmp_path / "checkpoints"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not the run's")
    root.mkdir()
    (root / "step-000001.corrupt").symlink_to(elsewhere)
    for version in (2, 3, 4):
        _torn(root, version)
    checkpoints.choose_resume(root)
    assert not (root / "step-000001.corrupt").is_symlink()
    assert (elsewhere / "keep.txt").read_text() == "not the run's"
