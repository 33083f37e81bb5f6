"""The project's import graph from ``ast``: every import statement counts, lazy ones inside functions too.

Used by ``tests/test_dependency_direction.py`` (no cycles, no module only tests use) and by
``bench/structure.py`` (the figures of docs/architecture.md). Module names are the installed ones:
``api/job.py`` is ``asyncrl.api.job``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("api", "trainer", "rollout", "operator", "monitoring")
# where a module may be named as a string that the program itself resolves (task and engine registries,
# ``python -m`` commands of the chart, the image and the Makefile, the package's entry points)
USE_SITES = ("api", "trainer", "rollout", "operator", "monitoring", "charts", "docker", "examples", "crds",
             "Makefile", "pyproject.toml", "setup.py", ".ci")


def source_files() -> list[Path]:
    return sorted(p for top in TOPS for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(("asyncrl", *parts))


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports_of(path: Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """``(line, project module)`` for every import in ``path`` that names a module of ``known``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for name in names:
            # ``import asyncrl.trainer.driver.loop`` also imports the packages above it; those edges
            # carry no design information (an ``__init__`` that re-exports is its own edge) and are left out
            if name in known:
                yield node.lineno, name


def module_graph(files: list[Path] | None = None) -> dict[str, set[str]]:
    """``{module: project modules it imports}`` over the project's packages (packages' ``__init__`` too)."""
    files = source_files() if files is None else files
    known = {module_name(p) for p in files}
    graph: dict[str, set[str]] = {}
    for p in files:
        me = module_name(p)
        graph[me] = {m for _, m in imports_of(p, known) if m != me}
    return graph


def _sccs(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components (iterative), each of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp: set[str] = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def package_of(module: str) -> str:
    return module.rsplit(".", 1)[0]


def intra_package_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Cycles among the modules of one package (edges between modules of the same parent package only).

    An ``__init__`` importing its own submodules (re-export) is not a cycle of the package's modules, so
    edges from a package to its children are left out here.
    """
    inner = {m: {t for t in ts if package_of(t) == package_of(m) and not t.startswith(m + ".")}
             for m, ts in graph.items()}
    return _sccs(inner)


def all_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Every cycle between the project's modules, across packages too (package ``__init__`` edges left out)."""
    mods = {m for m in graph}
    leaves = {m: {t for t in ts if not any(o.startswith(t + ".") for o in mods)} for m, ts in graph.items()
              if not any(o.startswith(m + ".") for o in mods)}
    return _sccs(leaves)


def _named_in_use_sites() -> str:
    texts: list[str] = []
    for site in USE_SITES:
        p = ROOT / site
        files = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else []
        for f in files:
            if "__pycache__" in f.parts or f.suffix in (".png", ".pyc", ".tgz"):
                continue
            try:
                texts.append(f.read_text())
            except UnicodeDecodeError:
                continue
    return "\n".join(texts)


def _is_entry_point(path: Path) -> bool:
    """A module one runs as a command: it has an ``if __name__ == "__main__":`` block."""
    return any(isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and isinstance(n.test.left, ast.Name)
               and n.test.left.id == "__name__" for n in ast.parse(path.read_text()).body)


def _documented() -> str:
    """The user-facing documents, where a command (``python -m asyncrl...`` or ``python monitoring/x.py``) is documented."""
    files = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted(q for d in ("charts", "docker", ".ci") for q in (ROOT / d).rglob("*") if q.is_file())]
    texts = []
    for f in files:
        try:
            texts.append(f.read_text())
        except UnicodeDecodeError:
            continue
    return "\n".join(texts)


def test_only_modules(graph: dict[str, set[str]]) -> list[str]:
    """Modules no project module imports or names, and no document runs as a command (tests and benches do not count).

    Used means one of: imported by a project module; named as a dotted string at a use site (a registry
    entry, the chart's or the image's command, an entry point); run by file name by a sibling
    (``Path(__file__).with_name("vllm_server.py")``); a package's ``__main__`` when the package is named; or an
    entry point (a ``__main__`` block) whose command a document of the project shows.
    """
    imported = {t for m, ts in graph.items() for t in ts if t != m}
    sites, docs = _named_in_use_sites(), _documented()
    named = set(re.findall(r"asyncrl(?:\.[A-Za-z_][A-Za-z0-9_]*)+", sites))
    used = imported | named
    by_name = {module_name(p): p for p in source_files()}
    out = []
    for m in sorted(graph):
        if m in used or m.count(".") <= 1:  # asyncrl.api etc.: the top packages themselves
            continue
        if any(u.startswith(m + ".") for u in used):  # a package is used when any module in it is
            continue
        path = by_name.get(m)
        if path is not None:
            rel = str(path.relative_to(ROOT))
            if path.name == "__main__.py" and package_of(m) in used:
                continue
            siblings = [q for q in path.parent.glob("*.py") if q != path]
            if any(f'"{path.name}"' in q.read_text() for q in siblings):
                continue
            if _is_entry_point(path) and (f"-m {m}" in docs or f"python {rel}" in docs):
                continue
        out.append(m)
    return out
