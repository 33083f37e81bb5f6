"""The distribution layout: four subpackages import, and ``operator/`` never shadows the stdlib.

Both checks run in a subprocess started from the repository root (where a regular
``operator/__init__.py`` would shadow the standard library), once against the editable install of
the test environment and once against a freshly built wheel unpacked into a bare environment.
"""

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, operator, sysconfig
import asyncrl.api, asyncrl.trainer, asyncrl.rollout, asyncrl.operator
print(json.dumps({
    "operator": operator.__file__,
    "stdlib": sysconfig.get_paths()["stdlib"],
    "itemgetter": hasattr(operator, "itemgetter"),
    "api": asyncrl.api.__file__,
    "operator_pkg": list(asyncrl.operator.__path__),
}))
"""


def _probe(python: str, env: dict[str, str] | None = None) -> dict[str, object]:
    out = subprocess.run(
        [python, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, f"probe failed:\n{out.stderr}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def _assert_stdlib_operator(info: dict[str, object]) -> None:
    assert info["itemgetter"], info
    assert str(info["operator"]).startswith(str(info["stdlib"])), f"`import operator` is not the stdlib's: {info}"


def test_operator_folder_is_a_namespace_portion() -> None:
    # A regular package here would shadow the stdlib `operator` for anything started at the root.
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_editable_install_imports_from_repo_root() -> None:
    info = _probe(sys.executable)
    _assert_stdlib_operator(info)
    assert Path(str(info["api"])).resolve().is_relative_to(ROOT / "api")
    assert any(Path(p).resolve() == ROOT / "operator" for p in info["operator_pkg"])  # type: ignore[union-attr]


def test_wheel_install_imports_from_repo_root(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("asyncrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "asyncrl/api/__init__.py" in names
    assert not any(n.startswith(("api/", "operator/", "trainer/", "rollout/")) for n in names), "unmapped folder in wheel"
    assert "asyncrl/operator/__init__.py" not in names
    assert "asyncrl/api/examples/quickstart.yaml" in names

    # A bare environment that sees the test environment's third-party libraries but not its
    # editable finder (paths listed in a .pth are added without running their own .pth files).
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    zipfile.ZipFile(wheel).extractall(site)
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    info = _probe(str(python), env=clean_env)
    _assert_stdlib_operator(info)
    assert Path(str(info["api"])).resolve().is_relative_to(site.resolve()), info


@pytest.mark.parametrize("module", ["asyncrl.api"])
def test_api_stays_light(module: str) -> None:
    code = f"import sys, {module}; heavy = [m for m in ('torch', 'ray', 'kopf', 'megatron', 'transformers') if m in sys.modules]; print(heavy)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
