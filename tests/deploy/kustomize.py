"""`kubectl kustomize` of a kustomization under the project, alone or with components.

Shared with tests/kube_real (server dry-run of the same renderings).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from k8s_schema import PROJECT_ROOT

#: The optional components under deploy/components, by path.
COMPONENTS = sorted(str(p.parent.relative_to(PROJECT_ROOT))
                    for p in (PROJECT_ROOT / "deploy" / "components").glob("*/kustomization.yaml"))

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
    """The objects ``path`` (relative to the project) renders, with ``components`` added."""
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
