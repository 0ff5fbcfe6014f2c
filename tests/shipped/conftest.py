"""The product as a user installs it: the wheel, built from this tree, in a clean virtualenv.

No extras, nothing from the project's own environment: ``pip install <wheel>`` pulls the
declared dependencies from the package index (or pip's cache), exactly what the Dockerfile
does. The tests run its console script, never the project's modules.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
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


def _checked(cmd: list[str], what: str, timeout: float) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


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
    wheels = where / "wheels"
    _checked([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
              "--no-deps", "--wheel-dir", str(wheels), str(source)], "building the wheel", 300)
    (wheel,) = wheels.glob("modelpool_extproc-*.whl")
    home = where / "venv"
    # a virtualenv of its own: the project's .venv (dev extras) must not be visible to it
    venv.EnvBuilder(with_pip=True, clear=True, system_site_packages=False).create(home)
    _checked([str(home / "bin" / "python"), "-m", "pip", "install", "-q",
              "--disable-pip-version-check", str(wheel)], "installing the wheel", 600)
    return Installed(home, wheel)
