"""The image installs only locked files: requirements.lock pins every runtime dependency of
pyproject.toml (and nothing of an extra) at a version its specifier allows, each with hashes,
and the Dockerfile installs it, and the build lock, with --require-hashes. That the pins are
complete and consistent is checked by tests/shipped, which installs them as the image does."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def pins(lock: Path) -> dict[str, tuple[Version, int]]:
    """name -> (pinned version, number of hashes) of a pip-compile style lock."""
    found: dict[str, tuple[Version, int]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", lock.read_text()):
        head = re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)
        if head:
            found[canonicalize_name(head.group(1))] = (
                Version(head.group(2)), len(re.findall(r"--hash=sha256:[0-9a-f]{64}", block)))
    return found


def test_the_lock_pins_every_runtime_dependency_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = pins(ROOT / "requirements.lock")
    assert locked and all(hashes for _, hashes in locked.values()), "a pin without a hash"
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is not in requirements.lock: run `make lock`"
        assert requirement.specifier.contains(locked[name][0], prereleases=True), \
            f"{name}=={locked[name][0]} is outside {requirement.specifier}: run `make lock`"
    # the kubernetes client is only for auth-provider kubeconfigs: an extra, not in the image
    assert "kubernetes" not in locked
    assert any(Requirement(r).name == "kubernetes"
               for r in project["optional-dependencies"]["auth-provider"])
    build = pins(ROOT / "requirements-build.lock")
    assert "setuptools" in build and all(hashes for _, hashes in build.values())


def test_the_dockerfile_installs_from_the_locks_with_hashes() -> None:
    text = (ROOT / "Dockerfile").read_text()
    installs = re.findall(r"pip install ([^&\n]*)", text)
    assert any("--require-hashes -r requirements-build.lock" in i for i in installs), installs
    assert any("--require-hashes -r /tmp/requirements.lock" in i for i in installs), installs
    # nothing else is resolved from the index: the wheel goes in alone, from the build stage
    others = [i for i in installs if "--require-hashes" not in i]
    assert others and all("--no-deps" in i and "--no-index" in i for i in others), others
    assert "--no-build-isolation" in text and "pip check" in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "!requirements.lock" in ignored and "!requirements-build.lock" in ignored
