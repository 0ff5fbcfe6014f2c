"""The product as a user installs it: the wheel, built from this tree, in a clean virtualenv.

No extras, nothing from the project's own environment: the steps of the Dockerfile, each
from its lock with every file's hash checked (``pip install --require-hashes``), the wheel
built without build isolation from the build lock, installed without resolving anything,
then ``pip check``. The tests run its console script, never the project's modules.
"""

from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Installed:
    """A clean virtualenv holding the built wheel and only its declared dependencies."""

    def __init__(self, home: Path, wheel: Path) -> None:
        self.home = home
        self.wheel = wheel
        self.python = home / "bin" / "python"
        self.command = home / "bin" / "modelpool-extproc"

    def run(self, *args: str, timeout: float = 60.0, **kwargs) -> subprocess.CompletedProcess:
        """Run the installed command with ``args``; its output as text."""
        return subprocess.run([str(self.command), *args], capture_output=True, text=True,
                              timeout=timeout, **kwargs)


def _pip(home: Path, *args: str, cwd: Path | None = None) -> None:
    """Run pip of the virtualenv at ``home``; AssertionError with its output if it fails."""
    cmd = [str(home / "bin" / "python"), "-m", "pip", "-q", "--disable-pip-version-check", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd)
    if done.returncode != 0:
        raise AssertionError(f"pip {' '.join(args)} failed ({done.returncode}):\n"
                             f"{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the wheel from this tree and install it, without extras, into a new virtualenv."""
    where = tmp_path_factory.mktemp("shipped")
    # What the Dockerfile's build stage copies, and nothing else: building in the tree would
    # leave setuptools' build/ there, whose stale copies of moved modules a later wheel ships
    source = where / "source"
    for part in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy2(ROOT / part, source / part)
    shutil.copytree(ROOT / "extproc", source / "extproc",
                    ignore=shutil.ignore_patterns("__pycache__"))
    builder = where / "builder"
    venv.EnvBuilder(with_pip=True, clear=True, system_site_packages=False).create(builder)
    _pip(builder, "install", "--require-hashes", "-r", str(ROOT / "requirements-build.lock"))
    wheels = where / "wheels"
    _pip(builder, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels),
         str(source), cwd=source)
    (wheel,) = wheels.glob("modelpool_extproc-*.whl")
    home = where / "venv"
    # a virtualenv of its own: the project's .venv (dev extras) must not be visible to it
    venv.EnvBuilder(with_pip=True, clear=True, system_site_packages=False).create(home)
    _pip(home, "install", "--require-hashes", "-r", str(ROOT / "requirements.lock"))
    _pip(home, "install", "--no-deps", "--no-index", "--find-links", str(wheels),
         "modelpool-extproc")
    _pip(home, "check")
    return Installed(home, wheel)
