"""The project's files cite only what ships with it: no document outside the repository.

Users get this repository, nothing beside it; a comment or a doc page that points at a file they do not
have (a team-internal map, a reference copy of a paper, a measurement report) sends them nowhere. The
paper is cited by its title and arXiv number (``docs/architecture.md``), measured facts live in ``docs/``.
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A citation of a file outside the repository: the team's shared folder, its reference copies, the old map.
# The names are assembled from pieces so that this file does not itself cite them.
_SHARED, _REF, _MAP = "sha" + "red", "refer" + "ence", "ARCHI" + "TECTURE"
OUTSIDE = re.compile(
    re.escape(f"../{_SHARED}") + f"|{_SHARED}/{_REF}|(?<![\\w/]){_REF}/[\\w-]+\\.md|{_MAP} §")
CHECKED = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".json", ".tpl", ".cfg")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return [ROOT / line for line in out.stdout.splitlines()
            if line.endswith(CHECKED) or line in ("Makefile", ".ci/run")]


def test_no_file_cites_a_document_outside_the_repository() -> None:
    here = Path(__file__).resolve()
    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
           for p in _tracked() if p.resolve() != here and p.is_file()
           for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert bad == [], "cite docs/ in the repository instead:\n" + "\n".join(bad)


# A document cited by its file name (``feasibility.md §2``, ``rl-on-cpu §4``): it must be one the repository has.
CITED_MD = re.compile(r"(?<![\w/.:%-])((?:[\w.-]+/)*([\w-]+)\.md)(?![\w/])|(?<![\w/.-])([a-z][\w-]*-[\w-]*) §\d")
# file names the tests and the code create themselves (a user's folder of notes that an export must not delete)
MADE_HERE = {"notes"}


def _cited_md(line: str) -> list[str]:
    return [m.group(2) or m.group(3) for m in CITED_MD.finditer(line)
            if "http" not in line[max(0, m.start() - 80):m.start()]]


def test_every_cited_document_is_in_the_repository() -> None:
    here = Path(__file__).resolve()
    tracked = _tracked()
    have = {p.stem for p in tracked if p.suffix == ".md"} | MADE_HERE
    bad = [f"{p.relative_to(ROOT)}:{n}: {name}"
           for p in tracked if p.resolve() != here and p.is_file() and not p.is_symlink()
           and not str(p.relative_to(ROOT)).startswith("docs/results/data/")
           for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
           for name in _cited_md(line) if name not in have]
    assert bad == [], "these cite a document the repository does not have:\n" + "\n".join(bad)


def test_the_cited_document_pattern() -> None:
    assert _cited_md("as measured (" + "rl-on-cpu" + ".md §5b)") == ["rl-on-cpu"]
    assert _cited_md("the recipe (" + "rl-on-cpu" + " §4)") == ["rl-on-cpu"]
    assert _cited_md("see docs/architecture.md and docs/runbooks/AsyncRLEwmaReset.md") == ["architecture",
                                                                                          "AsyncRLEwmaReset"]
    assert _cited_md("https://example.org/x.md") == []


def test_the_pattern_catches_each_form() -> None:
    for cited in (f"see ../{_SHARED}/CONVENTIONS.md", f"(``{_SHARED}/{_REF}/feasibility.md`` §2)",
                  f"{_REF}/paper.md §6", f"{_MAP} §3"):
        assert OUTSIDE.search(cited), cited
    for fine in ("docs/architecture.md", "the reference policy", "api/reference.py", "docs/results/data/x.json"):
        assert not OUTSIDE.search(fine), fine
