"""The structure of the source tree, measured: the figures ``docs/architecture.md`` is held to.

Usage::

    .venv/bin/python bench/structure.py            # files per folder, Any counts, longest functions, cycles
    .venv/bin/python bench/structure.py --json     # the same as one JSON object

Every figure comes from ``ast`` over the project's own packages (``api``, ``trainer``, ``rollout``,
``operator``, ``monitoring``); imports inside functions count (a lazy import is still a dependency).
``tests/test_dependency_direction.py`` refuses intra-package cycles and modules only tests import with
the same graph (`tests/support/import_graph.py`).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import import_graph as g  # noqa: E402


def files_per_folder(top: str = "trainer") -> dict[str, int]:
    """``{folder: number of .py files directly in it}`` under ``top``."""
    out: dict[str, int] = {}
    for d in sorted([ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]):
        if d.name == "__pycache__":
            continue
        n = len(list(d.glob("*.py")))
        if n:
            out[str(d.relative_to(ROOT))] = n
    return out


def any_counts(folder: str = "trainer/driver") -> dict[str, int]:
    """Occurrences of ``Any`` and of ``dict[str, Any]`` in the annotations and code of ``folder``."""
    text = "".join(p.read_text() for p in sorted((ROOT / folder).rglob("*.py")))
    import re

    return {"Any": len(re.findall(r"\bAny\b", text)), "dict[str, Any]": text.count("dict[str, Any]")}


def longest_functions(n: int = 10) -> list[tuple[int, str]]:
    """The ``n`` longest function bodies (lines, ``path:qualname``) of the project's packages."""
    found: list[tuple[int, str]] = []
    for path in g.source_files():
        tree, where = ast.parse(path.read_text()), path.relative_to(ROOT)

        def walk(node: ast.AST, prefix: str, where: Path = where) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}{child.name}"
                    found.append((child.end_lineno - child.lineno + 1, f"{where}:{name}"))
                    walk(child, name + ".")
                elif isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")

        walk(tree, "")
    return sorted(found, reverse=True)[:n]


def measure() -> dict[str, object]:
    graph = g.module_graph()
    return {
        "files_per_folder": files_per_folder(),
        "trainer/driver": any_counts(),
        "longest_functions": [{"lines": n, "function": f} for n, f in longest_functions()],
        "intra_package_cycles": [sorted(c) for c in g.intra_package_cycles(graph)],
        "imported_only_by_tests": g.test_only_modules(graph),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    m = measure()
    if args.json:
        print(json.dumps(m, indent=1))
        return 0
    print("files per folder (trainer/):")
    for k, v in m["files_per_folder"].items():  # type: ignore[union-attr]
        print(f"  {v:3d}  {k}")
    print(f"trainer/driver: {m['trainer/driver']}")
    print("longest functions:")
    for row in m["longest_functions"]:  # type: ignore[union-attr]
        print(f"  {row['lines']:4d}  {row['function']}")
    print(f"intra-package import cycles: {m['intra_package_cycles'] or 'none'}")
    print(f"modules imported only by tests or benches: {m['imported_only_by_tests'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
