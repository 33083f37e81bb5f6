"""The dependency direction of docs/architecture.md, dependency rules, checked on the source with ``ast``.

(import-linter cannot see ``asyncrl.operator``: it is a namespace portion without ``__init__.py``,
which grimp does not index — so the contracts are checked here instead.) Every import statement
counts, including ones inside functions: a lazy import is still a dependency.
"""

import ast
from pathlib import Path

import pytest

from tests.support import import_graph

ROOT = Path(__file__).resolve().parents[1]

# package folder -> modules it must never import (prefix match on the dotted name)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "api": ("torch", "ray", "kopf", "kubernetes", "megatron", "transformers",
            "asyncrl.trainer", "asyncrl.rollout", "asyncrl.operator"),
    "rollout": ("kopf", "kubernetes", "megatron", "asyncrl.trainer", "asyncrl.operator"),
    "trainer": ("kopf", "asyncrl.operator"),
    "operator": ("torch", "ray", "megatron", "transformers", "asyncrl.trainer", "asyncrl.rollout"),
    # inside trainer: correction (pure math), collective (stores) <- megatron (primitives) <- checkpoint, weight_sync,
    # oldlogits <- actor <- driver
    # <- cli; export (the HF folder writer, called by the driver during training) sits below the driver, and
    # cli is the entry point nothing imports
    "trainer/correction": ("megatron", "ray", "transformers", "asyncrl.rollout", *(
        f"asyncrl.trainer.{p}" for p in ("megatron", "weight_sync", "oldlogits", "actor", "driver", "export", "cli"))),
    # the job's authenticated rendezvous stores: below everything that forms a process group with them
    "trainer/collective": ("megatron", "transformers", "asyncrl.rollout", *(
        f"asyncrl.trainer.{p}" for p in ("correction", "megatron", "weight_sync", "oldlogits", "actor", "driver",
                                         "export", "cli"))),
    "trainer/megatron": tuple(f"asyncrl.trainer.{p}" for p in ("weight_sync", "oldlogits", "actor", "driver",
                                                               "export", "cli")),
    # the checkpoint folder (format, DCP shards, the data-only reader): above the megatron primitives it saves
    "trainer/checkpoint": tuple(f"asyncrl.trainer.{p}" for p in ("weight_sync", "oldlogits", "actor", "driver",
                                                                 "export", "cli")),
    "trainer/weight_sync": tuple(f"asyncrl.trainer.{p}" for p in ("oldlogits", "actor", "driver", "export", "cli")),
    "trainer/oldlogits": tuple(f"asyncrl.trainer.{p}" for p in ("actor", "driver", "export", "cli")),
    # the actor is one process's model and optimizer: no Ray, no cluster, no rollout, nothing of the driver
    "trainer/actor": ("ray", "kubernetes", "asyncrl.rollout",
                      *(f"asyncrl.trainer.{p}" for p in ("driver", "export", "cli"))),
    "trainer/driver": ("asyncrl.trainer.cli",),
    # inside the driver: run (directory, metrics, checkpoints, faults) <- hosts (the Ray processes) <- loop (the
    # stages), and run <- status (what the driver reports); nothing below imports what is above it
    "trainer/driver/run": tuple(f"asyncrl.trainer.driver.{p}" for p in ("loop", "hosts", "status")),
    "trainer/driver/hosts": tuple(f"asyncrl.trainer.driver.{p}" for p in ("loop", "status")),
    "trainer/driver/status": tuple(f"asyncrl.trainer.driver.{p}" for p in ("loop", "hosts")),
    "trainer/driver/loop": ("asyncrl.trainer.driver.status",),
    # the command line and the pods' entry points: the top, nothing imports it (trainer/driver's rule says so)
    "trainer/cli": (),
    "trainer/export.py": ("ray", *(f"asyncrl.trainer.{p}" for p in ("driver", "cli"))),
    # inside rollout: tasks and environments know no engine, worker or episode machinery (those use them)
    "rollout/envs": ("ray", "vllm", *(f"asyncrl.rollout.{m}" for m in (
        "engine", "engine_registry", "generation_loop", "hf_engine", "vllm_engine", "vllm_process", "vllm_server",
        "worker", "episode", "bench"))),
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


def test_every_driver_subpackage_has_a_direction() -> None:
    subpackages = {f"trainer/driver/{p.parent.name}" for p in (ROOT / "trainer" / "driver").glob("*/__init__.py")}
    assert subpackages - set(FORBIDDEN) == set(), "give each subpackage of trainer/driver its rule in FORBIDDEN"


def test_no_import_cycle_inside_a_package() -> None:
    """Modules of one package import each other one way only; an import inside a function counts (a lazy import
    hides a cycle from Python, not from this test)."""
    cycles = [sorted(c) for c in import_graph.intra_package_cycles(import_graph.module_graph())]
    assert cycles == [], "break these cycles (a module of its own for what both need, or a Protocol):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_intra_package_cycle_detection_sees_a_lazy_import(tmp_path: Path) -> None:
    """The detector itself: a cycle closed only by an import inside a function is found; a one-way pair is not."""
    pkg = tmp_path / "api"
    pkg.mkdir()
    (pkg / "a.py").write_text("import asyncrl.api.b\n")
    (pkg / "b.py").write_text("def f():\n    from asyncrl.api.a import x\n")
    (pkg / "c.py").write_text("from asyncrl.api import a\n")
    root, import_graph.ROOT = import_graph.ROOT, tmp_path
    try:
        graph = import_graph.module_graph(sorted(pkg.glob("*.py")))
    finally:
        import_graph.ROOT = root
    assert [sorted(c) for c in import_graph.intra_package_cycles(graph)] == [["asyncrl.api.a", "asyncrl.api.b"]]


def test_no_module_is_imported_only_by_tests() -> None:
    """Every module of the project's packages is used by the program itself: imported, named in a registry or a
    pod's command, or a documented ``python -m`` / ``python path.py`` command. A module only tests or benches use
    is a twin of production code or dead code (bench helpers belong in ``bench/``)."""
    unused = import_graph.test_only_modules(import_graph.module_graph())
    assert unused == [], "no program path uses these modules; delete them or make production use them:\n" + "\n".join(
        unused)
