"""Monitoring against a live service: every series the dashboard and the alerts name is one
the running ext_proc exports, and the alerts fire (or stay quiet) on the series it really
emitted, run through `promtool test rules` (the promtool `make ops-tools` builds)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from devstack.stack import LocalStack
from e2e_support import NAMESPACE, chat, eventually, pools, wait_resident

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "tests" / "deploy"))
from alerting import run_promtool_tests  # noqa: E402  (tests/deploy helper)

MONITORING = PROJECT_ROOT / "deploy" / "monitoring"
STACK_DOCS = pools(("mon", ["mon-a", "mon-b", "mon-c"], {"default": "mon-a"}))
FAIL = "sim.llmkube.dev/fail"
# Scrape target labels Prometheus adds (the ServiceMonitor's job is the Service's name).
TARGET = {"job": "modelpool-extproc", "instance": "10.0.0.7:9090"}
# Series Prometheus itself makes, not the service.
SYNTHETIC = {"up"}
# Families declared (HELP/TYPE) that get samples only on events this stack does not cause:
# a deferral needs an idle probe reporting busy or unreachable; a watch restart, an API fault;
# a cut request, an idle probe contradicted (e2e/test_e2e_probecheck.py causes one); a
# prompt-cache carry, a member with the carry annotation (e2e/test_e2e_warm.py has them).
EVENT_ONLY = {"llmkube_modelpool_busy_skips_total", "modelpool_extproc_conflicts_total",
              "llmkube_modelpool_reclaims_total", "modelpool_extproc_requests_cut_total",
              "modelpool_extproc_prompt_cache_carry_total",
              "modelpool_extproc_prompt_cache_tokens_total",
              "modelpool_extproc_swap_deferred_total",
              "modelpool_extproc_watch_restarts_total",
              "modelpool_extproc_picker_served_elsewhere_total"}
_NAME = re.compile(r"\b((?:llmkube_modelpool|modelpool_extproc|process)_[a-z_]+|up)\b(?!\s*\()")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _names(expr: str) -> set[str]:
    return set(_NAME.findall(expr))


def _dashboard_queries() -> list[str]:
    dash = json.loads((MONITORING / "modelpool-dashboard.json").read_text())
    queries = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    queries += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return queries


def _rules() -> dict[str, Any]:
    return yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]


def _declared(stack: LocalStack) -> set[str]:
    import urllib.request

    with urllib.request.urlopen(stack.metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    return set(re.findall(r"^# TYPE (\S+) \S+$", text, re.M))


@pytest.fixture(scope="module")
def scrapes(stack: LocalStack) -> tuple[Samples, Samples]:
    """(mid-swap, after a completed and a failed swap): the live /metrics, parsed."""
    return asyncio.run(_drive(stack))


async def _drive(stack: LocalStack) -> tuple[Samples, Samples]:
    async with aiohttp.ClientSession() as http:
        await wait_resident(stack, "mon", "mon-a")
        # two requests for one swap: the second joins it (coalesced)
        held = asyncio.gather(chat(http, stack, "mon-b"), chat(http, stack, "mon-b"))
        mid: Samples = await eventually(
            lambda: (s := stack.metrics()) and any(n == "modelpool_extproc_swap_target"
                                                   for n, _ in s) and s,
            what="a scrape while the swap to mon-b is under way")
        assert [reply.status for reply in await held] == [200, 200]
        stack.annotate("mon-c", FAIL, "true")
        failed = await chat(http, stack, "mon-c")
        assert failed.status == 503, failed.body
        after = await eventually(
            lambda: stack.metric("modelpool_extproc_swaps_total", outcome="failed") and
            stack.metrics(), what="the failed swap to be counted")
    return mid, after


def test_every_dashboard_and_alert_series_is_exported(stack: LocalStack, scrapes) -> None:
    exported = {name for scrape in scrapes for name, _ in scrape}
    declared = _declared(stack)
    wanted: dict[str, str] = {}
    for query in _dashboard_queries():
        wanted |= {n: f"dashboard: {query}" for n in _names(query)}
    for group in _rules()["groups"]:
        for rule in group["rules"]:
            wanted |= {n: f"alert {rule['alert']}" for n in _names(rule["expr"])}
    assert len(wanted) > 25
    for name, where in sorted(wanted.items()):
        if name in SYNTHETIC:
            continue
        if name in EVENT_ONLY:
            assert name in declared, f"{name} ({where}) is not even declared"
            continue
        assert name in exported, f"{name} ({where}) is not exported by the live service"


def _series(name: str, labels: frozenset[tuple[str, str]], extra: dict[str, str]) -> str:
    pairs = dict(labels) | TARGET | extra
    body = ", ".join(f'{k}="{v}"'.replace("\\", "\\\\") for k, v in sorted(pairs.items()))
    return f"{name}{{{body}}}"


def _input_series(scrape: Samples, override: dict[str, float] | None = None) -> list[dict]:
    """The scrape as promtool input: gauges flat, counters rising from 0 to their value."""
    out = [{"series": _series("up", frozenset(), {}), "values": "1x20"}]
    for (name, labels), value in scrape.items():
        value = (override or {}).get(name, value)
        rising = name.endswith(("_total", "_count", "_sum", "_bucket"))
        out.append({"series": _series(name, labels, {}),
                    "values": f"0 {value}x19" if rising else f"{value}x20"})
    return out


def _labels_of(scrape: Samples, name: str) -> dict[str, str]:
    ((labels,),) = [[ls for n, ls in scrape if n == name and ("pool", "mon") in ls]]
    return dict(labels)


def _run(tmp_path: Path, tests: list[dict]) -> None:
    out = run_promtool_tests(tmp_path, {"rule_files": ["alerts.rules.yaml"],
                                        "evaluation_interval": "1m", "tests": tests})
    assert out.returncode == 0, out.stdout + out.stderr


def _expected(alert: str, labels: dict[str, str]) -> list[dict]:
    (rule,) = [r for g in _rules()["groups"] for r in g["rules"] if r["alert"] == alert]
    annotations = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""),
                             v) for k, v in rule["annotations"].items()}
    return [{"exp_labels": labels | rule["labels"], "exp_annotations": annotations}]


def test_alerts_on_the_series_the_service_emitted(scrapes, tmp_path: Path) -> None:
    mid, after = scrapes
    pool = {"namespace": NAMESPACE, "pool": "mon"}
    quiet = ["ModelPoolExtprocDown", "ModelPoolExtprocNotReady", "ModelPoolDegraded",
             "ModelPoolSwapOverBudget", "ModelPoolHeldRequestsRejected",
             "ModelPoolWatchRestartLoop"]
    budget = after[("modelpool_extproc_swap_budget_seconds",
                    frozenset(_labels_of(after, "modelpool_extproc_swap_budget_seconds").items()))]
    _run(tmp_path, [
        {"name": "after a good and a failed swap", "interval": "1m",
         "input_series": _input_series(after),
         "alert_rule_test": [{"eval_time": "10m", "alertname": a, "exp_alerts": []}
                             for a in quiet] + [
             {"eval_time": "2m", "alertname": "ModelPoolMemberFailedToLoad",
              "exp_alerts": _expected("ModelPoolMemberFailedToLoad", pool | {"to": "mon-c"})}]},
        {"name": "the mid-swap scrape, as if that swap never ended", "interval": "1m",
         "input_series": _input_series(mid, {"modelpool_extproc_swap_age_seconds": budget + 60}),
         "alert_rule_test": [
             {"eval_time": "3m", "alertname": "ModelPoolSwapOverBudget",
              "exp_alerts": _expected("ModelPoolSwapOverBudget",
                                      _labels_of(mid, "modelpool_extproc_swap_age_seconds")
                                      | TARGET)}]},
    ])
