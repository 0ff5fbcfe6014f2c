"""Render the Helm chart with the real `helm` binary (built by `make ops-tools`)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from k8s_schema import PROJECT_ROOT
from tools import tool_binary

CHART = PROJECT_ROOT / "charts" / "modelpool-extproc"
RELEASE = "modelpool-extproc"
NAMESPACE = "llm"
#: The documented combinations: the defaults, then every file under the chart's ci/.
COMBINATIONS = ["default"] + sorted(p.stem for p in (CHART / "ci").glob("*-values.yaml"))

_CACHE: dict[str, list[dict[str, Any]]] = {}


def helm_binary() -> Path:
    """The helm binary; skips (saying how to get it) when it is not built."""
    return tool_binary("MODELPOOL_HELM_BIN", ".tools/bin/helm",
                       "run `make ops-tools`: a Go module build")


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
