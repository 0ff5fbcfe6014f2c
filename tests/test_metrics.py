"""The exported metrics: LLMKube's series exactly as LLMKube's table states them (fixture),
our richer series beside them, and the gauges the alerts need, fed by the runtime's calls."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from extproc import metrics
from extproc.policy.model import MemberObservation, PoolKey, PoolPhase, PoolView

TABLE = Path(__file__).parent / "data" / "llmkube-metrics.md"
# Rows we do not export, and why.
_TYPES = {"gauge": "gauge", "counter": "counter", "histogram": "histogram"}


def _llmkube_rows() -> list[tuple[str, str, list[str], str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`llmkube_"):
            rows.append((cells[0].strip("`"), cells[1], [x.strip() for x in cells[2].split(",")],
                         cells[3]))
    return rows


def _family(name: str):
    base = name.removesuffix("_total")
    for collector in list(metrics.REGISTRY._collector_to_names):  # noqa: SLF001 (read only)
        if getattr(collector, "_name", None) == base:
            return collector
    raise AssertionError(f"{name} is not exported")


def _buckets(notes: str) -> tuple[float, ...]:
    """`buckets 1, 2, 4 ... 512 s` -> the doubling series it abbreviates."""
    numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", notes)]
    first, second, last = numbers[0], numbers[1], numbers[-1]
    assert second == 2 * first
    out = [first]
    while out[-1] < last:
        out.append(round(out[-1] * 2, 6))
    assert out[-1] == last
    return tuple(out)


def test_the_fixture_is_the_table() -> None:
    rows = _llmkube_rows()
    assert len(rows) == 8 and rows[0][0] == "llmkube_modelpool_resident"


@pytest.mark.parametrize("row", _llmkube_rows(), ids=lambda r: r[0])
def test_llmkube_series_match_llmkube(row) -> None:
    name, kind, labels, notes = row
    metric = _family(name)
    assert metric._type == _TYPES[kind]
    assert list(metric._labelnames) == labels
    if "buckets" in notes:
        assert tuple(metric._upper_bounds[:-1]) == _buckets(notes)


def test_no_other_llmkube_series() -> None:
    names = {f.name for f in metrics.REGISTRY.collect() if f.name.startswith("llmkube_")}
    table = {n.removesuffix("_total") for n, *_ in _llmkube_rows()}
    assert names <= table


def test_no_created_series_and_process_collectors() -> None:
    text = generate_latest(metrics.REGISTRY).decode()
    assert "_created" not in text
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total",
                 "process_open_fds"):
        assert re.search(rf"^{name} ", text, re.M), name


def _sample(name: str, **labels: str) -> float | None:
    for family in metrics.REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def test_runtime_calls_feed_both_families() -> None:
    metrics.configure("gpu-a")
    ns, pool = "t-both", "p"
    metrics.held_counts(ns, pool, {"b": 2}, ("a", "b"))  # the request book's counts
    metrics.request_coalesced(ns, pool, "b")
    assert _sample("llmkube_modelpool_held_requests", router="gpu-a", pool=pool, member="b") == 2
    assert _sample("modelpool_extproc_held_requests", namespace=ns, pool=pool, member="b") == 2
    assert _sample("modelpool_extproc_held_requests", namespace=ns, pool=pool, member="a") == 0
    assert _sample("llmkube_modelpool_coalesced_total", router="gpu-a", pool=pool,
                   member="b") == 1
    metrics.hold_ended(ns, pool, "b", "swap_budget_exceeded", 3.0)
    metrics.held_counts(ns, pool, {"b": 1}, ("a", "b"))
    assert _sample("llmkube_modelpool_held_requests", router="gpu-a", pool=pool, member="b") == 1
    assert _sample("modelpool_extproc_hold_duration_seconds_count", namespace=ns, pool=pool,
                   member="b", outcome="swap_budget_exceeded") == 1
    metrics.swap_finished(ns, pool, "a", "b", completed=False, seconds=9.0)
    metrics.swap_finished(ns, pool, "a", "b", completed=True, seconds=30.0)
    # LLMKube counts completed swaps only, and has no outcome label
    assert _sample("llmkube_modelpool_swaps_total", router="gpu-a", pool=pool,
                   **{"from": "a", "to": "b"}) == 1
    assert _sample("modelpool_extproc_swaps_total", namespace=ns, pool=pool,
                   outcome="failed") == 1
    assert _sample("llmkube_modelpool_swap_duration_seconds_sum", router="gpu-a",
                   pool=pool) == 30.0
    metrics.swap_deferred(ns, pool, "PodsBusy", "a")
    metrics.swap_deferred(ns, pool, "IdleCheckFailed", "a")
    assert _sample("llmkube_modelpool_busy_skips_total", router="gpu-a", pool=pool,
                   member="a") == 1
    assert _sample("modelpool_extproc_swap_deferred_total", namespace=ns, pool=pool,
                   reason="IdleCheckFailed") == 1
    metrics.configure("default")


def _view(ns: str, phase: PoolPhase, resident: str, pending: str) -> PoolView:
    members = tuple(MemberObservation(m, phase="Ready") for m in ("a", "b"))
    return PoolView(PoolKey(ns, "p"), phase, resident, pending, members, 1)


def test_pool_gauges_follow_the_published_view() -> None:
    ns = "t-view"
    metrics.pool_published(_view(ns, PoolPhase.SWAPPING, "", "b"), 120.0, ())
    assert _sample("modelpool_extproc_pool_phase", namespace=ns, phase="Swapping") == 1
    assert _sample("modelpool_extproc_pool_phase", namespace=ns, phase="Ready") == 0
    assert _sample("modelpool_extproc_swap_in_progress", namespace=ns) == 1
    assert _sample("modelpool_extproc_swap_target", namespace=ns, member="b") == 1
    assert _sample("modelpool_extproc_swap_budget_seconds", namespace=ns) == 120.0
    assert _sample("modelpool_extproc_swap_age_seconds", namespace=ns) >= 0.0
    metrics.pool_published(_view(ns, PoolPhase.READY, "b", ""), 120.0, ("a", "b"))
    assert _sample("modelpool_extproc_swap_in_progress", namespace=ns) == 0
    assert _sample("modelpool_extproc_swap_target", namespace=ns, member="b") is None
    assert _sample("modelpool_extproc_swap_age_seconds", namespace=ns) == 0.0
    assert _sample("llmkube_modelpool_resident", namespace=ns, member="b") == 1
    assert _sample("llmkube_modelpool_resident", namespace=ns, member="a") == 0
    metrics.pool_closed(ns, "p", ("a", "b"))
    for name in ("llmkube_modelpool_resident", "modelpool_extproc_pool_phase",
                 "modelpool_extproc_swap_age_seconds", "modelpool_extproc_swap_budget_seconds"):
        assert _sample(name, namespace=ns) is None, name
