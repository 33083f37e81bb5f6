"""The dependency direction of ARCHITECTURE §2, checked on the source with ``ast``.

(import-linter cannot see ``asyncrl.operator``: it is a namespace portion without ``__init__.py``,
which grimp does not index — so the contracts are checked here instead.) Every import statement
counts, including ones inside functions: a lazy import is still a dependency.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package folder -> modules it must never import (prefix match on the dotted name)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "api": ("torch", "ray", "kopf", "kubernetes", "megatron", "transformers",
            "asyncrl.trainer", "asyncrl.rollout", "asyncrl.operator"),
    "rollout": ("kopf", "kubernetes", "megatron", "asyncrl.trainer", "asyncrl.operator"),
    "trainer": ("kopf", "asyncrl.operator"),
    "operator": ("torch", "ray", "megatron", "transformers", "asyncrl.trainer", "asyncrl.rollout"),
    # inside trainer: megatron (primitives) <- oldlogits <- actor <- driver
    "trainer/megatron": ("asyncrl.trainer.oldlogits", "asyncrl.trainer.actor", "asyncrl.trainer.driver"),
    "trainer/oldlogits": ("asyncrl.trainer.actor", "asyncrl.trainer.driver"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_dependency_direction(folder: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[folder])
    ]
    assert bad == [], "\n".join(bad)
