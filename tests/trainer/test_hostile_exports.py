"""Export targets and source folders as a careless or hostile user leaves them: ``--force`` replaces only a
folder an earlier export wrote, a link at ``--out`` is never written through or replaced, nothing
``.old-PID`` / ``.tmp-PID`` is left beside ``--out``, and a tokenizer or config file that links out of the
model folder is refused, never copied in. Each refusal is one line naming the path and the fix, and what
was there before is still there, byte for byte."""

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from asyncrl.api.validation import validate_job
from asyncrl.trainer import export
from asyncrl.trainer.export_target import check_target
from tests.support.hf_models import tiny_folder

pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("families"), "llama")


def _files(source: Path) -> export.ModelFiles:
    job = validate_job({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "exp"},
                        "spec": {"model": {"weights": str(source)}, "task": {"name": "calculator"}}}, "job.yaml")
    return export.model_files(job.spec)


def _weights(source: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for shard in sorted(source.glob("*.safetensors")):
        out |= load_file(str(shard))
    return out


def _snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root`` (links as their target text, never followed), to compare before and after."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = f"-> {os.readlink(path)}"
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out


# ------------------------------------------------------------------ targets
@dataclass(frozen=True)
class HostileTarget:
    """``make(tmp, model_export)`` leaves something at ``tmp / "out"``; the export with ``force`` is refused
    with ``message`` and everything under ``tmp`` is unchanged."""

    id: str
    make: Callable[[Path, Path], None]
    force: bool
    message: str


def _notes(tmp: Path, _: Path) -> None:
    (tmp / "out").mkdir()
    (tmp / "out" / "notes.md").write_text("three weeks of notes")


def _a_file(tmp: Path, _: Path) -> None:
    (tmp / "out").write_text("a file, not a folder")


def _link_to_export(tmp: Path, done: Path) -> None:
    (tmp / "out").symlink_to(done)


def _dangling(tmp: Path, _: Path) -> None:
    (tmp / "out").symlink_to(tmp / "nowhere")


def _marker_link(tmp: Path, done: Path) -> None:
    (tmp / "out").mkdir()
    (tmp / "out" / "notes.md").write_text("notes")
    (tmp / "out" / export.MARKER_FILE).symlink_to(done / export.MARKER_FILE)


def _marker_garbage(tmp: Path, _: Path) -> None:
    (tmp / "out").mkdir()
    (tmp / "out" / export.MARKER_FILE).write_text("{not json")


HOSTILE_TARGETS = [
    HostileTarget("force-on-a-folder-of-notes", _notes, True, "a folder without an asyncrl export marker"),
    HostileTarget("force-on-a-file", _a_file, True, "is a file: --force replaces only a folder"),
    HostileTarget("force-on-a-link-to-an-export", _link_to_export, True, "is a symbolic link"),
    HostileTarget("a-link-to-an-export", _link_to_export, False, "is a symbolic link"),
    HostileTarget("force-on-a-dangling-link", _dangling, True, "is a symbolic link"),
    HostileTarget("force-with-a-linked-marker", _marker_link, True, "without an asyncrl export marker"),
    HostileTarget("force-with-a-garbled-marker", _marker_garbage, True, "without an asyncrl export marker"),
]


@pytest.fixture(scope="module")
def done(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real export (elsewhere), which some targets link to."""
    out = tmp_path_factory.mktemp("done") / "export"
    export.write_hf_folder(_weights(model), _files(model), out, version=1)
    return out


@pytest.mark.parametrize("case", HOSTILE_TARGETS, ids=[c.id for c in HOSTILE_TARGETS])
def test_a_hostile_target_is_refused_and_left_as_it_was(case: HostileTarget, model: Path, done: Path,
                                                        tmp_path: Path) -> None:
    case.make(tmp_path, done)
    before, linked = _snapshot(tmp_path), _snapshot(done)
    with pytest.raises(export.ExportError) as err:
        export.write_hf_folder(_weights(model), _files(model), tmp_path / "out", version=2, overwrite=case.force)
    text = str(err.value)
    assert case.message in text and str(tmp_path / "out") in text and "\n" not in text, text
    assert _snapshot(tmp_path) == before  # nothing replaced, nothing left beside it (.tmp-PID, .old-PID)
    assert _snapshot(done) == linked  # the export a link points at is untouched


def test_force_replaces_an_export_and_leaves_nothing_beside_it(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export.write_hf_folder(_weights(model), _files(model), out, version=1)
    (tmp_path / ".out.old-4242").symlink_to(tmp_path / "gone")  # what a crashed replace left (a dangling link)
    (tmp_path / ".out.tmp-4243").mkdir()  # a crashed export's half-written folder
    result = export.write_hf_folder(_weights(model), _files(model), out, version=2, overwrite=True)
    assert result.version == 2 and json.loads((out / export.MARKER_FILE).read_text())["version"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_every_export_carries_the_marker_force_looks_for(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = export.write_hf_folder(_weights(model), _files(model), out, version=5, provenance={"job": "exp"})
    marker = json.loads((out / export.MARKER_FILE).read_text())
    assert marker["version"] == 5 and marker["job"] == "exp" and export.MARKER_FILE in result.files
    check_target(out, overwrite=True)  # what --force accepts


# ------------------------------------------------------------------ source folders
@dataclass(frozen=True)
class HostileSource:
    """``name`` in the model folder becomes a link to ``target(tmp)``; the export is refused with ``message``."""

    id: str
    name: str
    target: Callable[[Path], Path]
    message: str


def _secret(tmp: Path) -> Path:
    secret = tmp / "secret.txt"
    secret.write_text('{"token": "s3cr3t"}')  # JSON, so that even config.json would parse
    return secret


HOSTILE_SOURCES = [
    HostileSource("chat-template-links-to-a-secret", "chat_template.jinja", _secret, "outside the model folder"),
    HostileSource("tokenizer-links-to-a-secret", "tokenizer_config.json", _secret, "outside the model folder"),
    HostileSource("config-links-to-a-secret", "config.json", _secret, "outside the model folder"),
    HostileSource("generation-config-links-to-a-secret", "generation_config.json", _secret,
                  "outside the model folder"),
    HostileSource("chat-template-links-to-nothing", "chat_template.jinja", lambda tmp: tmp / "nothing",
                  "which does not exist"),
]


@pytest.mark.parametrize("case", HOSTILE_SOURCES, ids=[c.id for c in HOSTILE_SOURCES])
def test_a_file_linking_out_of_the_model_folder_is_refused_never_copied(case: HostileSource, model: Path,
                                                                        tmp_path: Path) -> None:
    import shutil

    source = tmp_path / "model"
    shutil.copytree(model, source)
    files, weights = _files(source), _weights(source)  # resolved while the folder was clean
    (source / case.name).unlink(missing_ok=True)
    (source / case.name).symlink_to(case.target(tmp_path))
    out = tmp_path / "out"
    with pytest.raises(export.ExportError) as err:
        export.write_hf_folder(weights, files, out, version=1)
    text = str(err.value)
    assert str(source / case.name) in text and case.message in text and "\n" not in text, text
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model", "secret.txt"] if "secret" in text
                                                                else ["model"])  # no out, no .tmp-PID


def test_a_hugging_face_cache_snapshot_exports_its_blobs_as_regular_files(model: Path, tmp_path: Path) -> None:
    """``models--org--name/snapshots/<rev>/x -> ../../blobs/<hash>``: links inside the cache's repository folder."""
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in sorted(model.iterdir()):
        blob = repo / "blobs" / f"blob-{path.name}"
        blob.write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(Path("../../blobs") / blob.name)
    out = tmp_path / "out"
    export.write_hf_folder(_weights(snapshot), _files(snapshot), out, version=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert not (out / name).is_symlink() and (out / name).read_bytes() == (model / name).read_bytes()
