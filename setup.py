"""Package mapping for the one ``asyncrl`` distribution.

There is no ``asyncrl/`` folder: ``api/``, ``trainer/``, ``rollout/`` and ``operator/`` at the
repository root become ``asyncrl.api`` ... ``asyncrl.operator``. ``operator/`` deliberately has no
``__init__.py`` (it is a namespace portion) so that Python started from the repository root keeps
importing the standard library's ``operator`` (docs/architecture.md, dependency rules; ``tests/test_layout.py`` proves it).
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
TOP = ("api", "trainer", "rollout", "operator")


def _packages() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for top in TOP:
        package_dir[f"asyncrl.{top}"] = top
        for d in sorted([ROOT / top, *(ROOT / top).rglob("*")]):
            if not d.is_dir() or d.name == "__pycache__":
                continue
            if not any(d.glob("*.py")) and d != ROOT / top:
                continue
            rel = d.relative_to(ROOT / top).parts
            packages.append(".".join(("asyncrl", top, *rel)))
    return packages, package_dir


PACKAGES, PACKAGE_DIR = _packages()

setup(packages=PACKAGES, package_dir=PACKAGE_DIR, package_data={"asyncrl.api": ["examples/*.yaml"]})
