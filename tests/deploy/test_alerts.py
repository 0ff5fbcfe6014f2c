"""The alerts: `promtool check rules` and `promtool test rules` (deploy/monitoring/
alerts_test.yaml) on the PrometheusRule's groups, and a runbook section for every alert."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from alerting import MONITORING, alerts, promtool, rule_groups, run_promtool_tests
from k8s_schema import PROJECT_ROOT


def test_promtool_check_rules(tmp_path: Path) -> None:
    rules = tmp_path / "alerts.rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups()))
    out = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in out.stdout


def test_promtool_unit_tests(tmp_path: Path) -> None:
    out = run_promtool_tests(tmp_path, (MONITORING / "alerts_test.yaml").read_text())
    assert out.returncode == 0, out.stdout + out.stderr
    tested = {case["alertname"] for t in yaml.safe_load((MONITORING / "alerts_test.yaml")
                                                        .read_text())["tests"]
              for case in t.get("alert_rule_test", []) if case["exp_alerts"]}
    assert tested == {a["alert"] for a in alerts()}, "an alert no test sees firing"


def test_a_broken_expectation_fails(tmp_path: Path) -> None:
    # the harness can fail: the same tests expecting the opposite must not pass
    tests = yaml.safe_load((MONITORING / "alerts_test.yaml").read_text())
    case = tests["tests"][0]["alert_rule_test"][0]
    case["exp_alerts"] = [{"exp_labels": {"severity": "critical"}}]
    assert run_promtool_tests(tmp_path, tests).returncode != 0


def test_every_alert_has_a_runbook_section() -> None:
    doc = (PROJECT_ROOT / "docs" / "operations.md").read_text()
    for alert in alerts():
        anchor = alert["annotations"]["runbook"]
        assert anchor == f"docs/operations.md#{alert['alert'].lower()}"
        assert f"### {alert['alert']}\n" in doc, f"no runbook section for {alert['alert']}"
        assert alert["labels"]["severity"] in ("critical", "warning")
