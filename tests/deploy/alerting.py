"""The alert rules as promtool sees them, and a runner for `promtool test rules`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MONITORING = PROJECT_ROOT / "deploy" / "monitoring"
PROMTOOL_ENV = "MODELPOOL_PROMTOOL_BIN"


def promtool() -> str:
    """promtool as `make ops-tools` builds it (Prometheus 3.16's Go module); skips saying how."""
    configured = os.environ.get(PROMTOOL_ENV)
    path = Path(configured) if configured else PROJECT_ROOT / ".tools" / "bin" / "promtool"
    if not os.access(path, os.X_OK):
        pytest.skip(f"no promtool at {path} (set {PROMTOOL_ENV} or run `make ops-tools`: "
                    "a Go build of github.com/prometheus/prometheus/cmd/promtool)")
    return str(path)


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rules file."""
    return yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]


def alerts() -> list[dict[str, Any]]:
    """Every alerting rule."""
    return [r for g in rule_groups()["groups"] for r in g["rules"] if "alert" in r]


def run_promtool_tests(workdir: Path, tests: dict[str, Any] | str) -> subprocess.CompletedProcess:
    """`promtool test rules` of ``tests`` (a test file's text or document) on our rules."""
    (workdir / "alerts.rules.yaml").write_text(yaml.safe_dump(rule_groups()))
    test_file = workdir / "alerts_test.yaml"
    test_file.write_text(tests if isinstance(tests, str) else yaml.safe_dump(tests))
    return subprocess.run([promtool(), "test", "rules", str(test_file)], capture_output=True,
                          text=True, timeout=120)
