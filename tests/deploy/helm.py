"""Render the Helm chart with the real `helm` binary (built by `make ops-tools`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from k8s_schema import PROJECT_ROOT

CHART = PROJECT_ROOT / "charts" / "modelpool-extproc"
RELEASE = "modelpool-extproc"
NAMESPACE = "llm"
#: The documented combinations: the defaults, then every file under the chart's ci/.
COMBINATIONS = ["default"] + sorted(p.stem for p in (CHART / "ci").glob("*-values.yaml"))

_CACHE: dict[str, list[dict[str, Any]]] = {}


def helm_binary() -> Path:
    """The helm binary; skips (saying how to get it) when it is not built."""
    raw = os.environ.get("MODELPOOL_HELM_BIN")
    path = Path(raw) if raw else PROJECT_ROOT / ".tools/bin/helm"
    if not path.exists():
        pytest.skip(f"no helm binary at {path} (run `make ops-tools`: a Go module build)")
    return path


def values_args(combination: str) -> list[str]:
    """The --values flags for one documented combination."""
    return [] if combination == "default" else ["--values",
                                                 str(CHART / "ci" / f"{combination}.yaml")]


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with ``args``; the result, whatever its exit code."""
    return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True,
                          timeout=120)


def render_chart(combination: str) -> list[dict[str, Any]]:
    """`helm template` of the chart for one combination, as objects (cached)."""
    if combination not in _CACHE:
        out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                   *values_args(combination))
        assert out.returncode == 0, f"helm template ({combination}) failed:\n{out.stderr}"
        _CACHE[combination] = [d for d in yaml.safe_load_all(out.stdout) if d]
    return _CACHE[combination]
