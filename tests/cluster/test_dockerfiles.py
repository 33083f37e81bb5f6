"""One recipe per image: the project's Dockerfiles are what tests/support/dockerfile.py executes for the cluster.

Fast and CPU-only (not ``cluster``): the parser refuses an instruction it does not execute, so a Dockerfile
cannot say something the test cluster's build ignores; the ``FROM`` lines take the base as ``ARG BASE`` whose
default is the image users build on.
"""

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from tests.support import dockerfile, oci

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("name", "default_base"), [
    ("operator.Dockerfile", "python:3.11.9-slim-bookworm"),
    ("job.Dockerfile", "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04"),
])
def test_the_dockerfiles_parse_and_take_their_base_as_an_argument(name: str, default_base: str) -> None:
    instructions = dockerfile.parse((ROOT / "docker" / name).read_text(), name)
    first_from = next(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    assert instructions[first_from].args == "${BASE}"
    assert [ins.args for ins in instructions[:first_from]] == [f"BASE={default_base}"]


def test_an_unknown_instruction_fails_the_parse_naming_line_and_fix() -> None:
    with pytest.raises(dockerfile.DockerfileError, match=r"x.Dockerfile:3: 'HEALTHCHECK' is not supported"):
        dockerfile.parse("FROM a\n# c\nHEALTHCHECK CMD true\n", "x.Dockerfile")


def test_continuations_and_comments_inside_them() -> None:
    ins = dockerfile.parse("FROM a\nRUN one \\\n# inside\n && two\n")
    assert [(i.keyword, i.args) for i in ins] == [("FROM", "a"), ("RUN", "one  && two")]


@pytest.mark.parametrize(("text", "want"), [
    ("$A/x", "1/x"), ("${A}", "1"), ("${B:-d}", "d"), ("${A:-d}", "1"), ("${A:+w$A}", "w1"), ("${B:+w}", ""),
])
def test_substitution_as_docker_does_it(text: str, want: str) -> None:
    assert dockerfile.expand(text, {"A": "1"}) == want


def _members(layer: oci.Layer) -> list[tarfile.TarInfo]:
    buf = io.BytesIO()
    oci._write_layer(layer.tree, layer.excludes, buf)  # type: ignore[arg-type]
    buf.seek(0)
    return tarfile.open(fileobj=buf).getmembers()


def test_a_layer_is_deterministic_and_whiteouts_become_oci_entries(tmp_path: Path) -> None:
    if os.geteuid() != 0:  # a fail, not a skip: the cluster suite runs as root (CI does), like every test beside it
        pytest.fail("overlay whiteouts are character devices: mknod needs root; run make test-cluster as root",
                    pytrace=False)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "b").write_text("b")
    (tmp_path / "a").write_text("a")
    os.mknod(tmp_path / "etc" / "gone", 0o600 | 0o020000, os.makedev(0, 0))  # overlay's "deleted here"
    first, second = oci.layer_digest(tmp_path), oci.layer_digest(tmp_path)
    assert first.digest == second.digest and first.size == second.size
    names = [m.name for m in _members(first)]
    assert names == ["a", "etc", "etc/b", "etc/.wh.gone"]  # sorted by the names on disk
    out = io.BytesIO()
    oci.write_archive(out, "x:1", [first], {"Env": []})
    out.seek(0)
    archive = tarfile.open(fileobj=out)
    index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == "x:1"
    assert f"blobs/sha256/{first.digest[7:]}" in archive.getnames()
