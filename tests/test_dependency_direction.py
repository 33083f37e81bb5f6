"""The dependency direction of docs/architecture.md, dependency rules, checked on the source with ``ast``.

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
    # inside trainer: correction (pure math), collective (stores) <- megatron (primitives) <- weightsync, oldlogits <- actor <- driver
    # <- cli; export (the HF folder writer, called by the driver during training) sits below the driver, and
    # cli is the entry point nothing imports
    "trainer/correction": ("megatron", "ray", "transformers", "asyncrl.rollout", *(
        f"asyncrl.trainer.{p}" for p in ("megatron", "weightsync", "oldlogits", "actor", "driver", "export", "cli"))),
    # the job's authenticated rendezvous stores: below everything that forms a process group with them
    "trainer/collective": ("megatron", "transformers", "asyncrl.rollout", *(
        f"asyncrl.trainer.{p}" for p in ("correction", "megatron", "weightsync", "oldlogits", "actor", "driver",
                                         "export", "cli"))),
    "trainer/megatron": tuple(f"asyncrl.trainer.{p}" for p in ("weightsync", "oldlogits", "actor", "driver",
                                                               "export", "cli")),
    "trainer/weightsync": tuple(f"asyncrl.trainer.{p}" for p in ("oldlogits", "actor", "driver", "export", "cli")),
    "trainer/oldlogits": tuple(f"asyncrl.trainer.{p}" for p in ("actor", "driver", "export", "cli")),
    # the actor is one process's model and optimizer: no Ray, no cluster, no rollout, nothing of the driver
    "trainer/actor": ("ray", "kubernetes", "asyncrl.rollout",
                      *(f"asyncrl.trainer.{p}" for p in ("driver", "export", "cli"))),
    "trainer/driver": ("asyncrl.trainer.cli",),
    "trainer/export.py": ("ray", *(f"asyncrl.trainer.{p}" for p in ("driver", "cli"))),
    # inside rollout: tasks and environments know no engine, worker or episode machinery (those use them)
    "rollout/envs": ("ray", "vllm", *(f"asyncrl.rollout.{m}" for m in (
        "engine", "hf_engine", "vllm_engine", "vllm_process", "vllm_server", "worker", "episode", "bench"))),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # ``from asyncrl.trainer import export`` imports the module asyncrl.trainer.export
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_dependency_direction(folder: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in ([ROOT / folder] if folder.endswith(".py") else sorted((ROOT / folder).rglob("*.py")))
        for line, name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[folder])
    ]
    assert bad == [], "\n".join(bad)


def test_every_subpackage_of_trainer_and_rollout_has_a_direction() -> None:
    subpackages = {f"{top}/{p.parent.name}" for top in ("trainer", "rollout") for p in (ROOT / top).glob("*/__init__.py")}
    assert subpackages - set(FORBIDDEN) == set(), "give each subpackage its rule in FORBIDDEN"
