"""Fixtures for the deploy tests: render kustomizations with `kubectl kustomize`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from k8s_schema import PROJECT_ROOT  # noqa: E402

_CACHE: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not on PATH (needed for `kubectl kustomize`)")
    return path


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {directory} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def render_path(path: str, components: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    key = (path, components)
    if key not in _CACHE:
        if not components:
            _CACHE[key] = _kustomize(PROJECT_ROOT / path)
        else:
            # a throwaway kustomization beside the others (kustomize wants relative paths)
            scratch = PROJECT_ROOT / "deploy" / f".test-{os.getpid()}"
            scratch.mkdir()
            try:
                rel = lambda p: os.path.relpath(PROJECT_ROOT / p, scratch)  # noqa: E731
                (scratch / "kustomization.yaml").write_text(yaml.safe_dump({
                    "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                    "resources": [rel(path)], "components": [rel(c) for c in components]}))
                _CACHE[key] = _kustomize(scratch)
            finally:
                shutil.rmtree(scratch)
    return _CACHE[key]


@pytest.fixture(scope="session")
def render() -> Callable[[str], list[dict[str, Any]]]:
    return render_path


@pytest.fixture(scope="session")
def render_with() -> Callable[..., list[dict[str, Any]]]:
    return lambda path, components=(): render_path(path, tuple(components))
