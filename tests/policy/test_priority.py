"""Priorities that decide swap order (policy/priority.py): the highest-priority held request's
member takes the slot next, ageing at the fairness window puts the oldest first again, and the
pool's objective mapping gives requests their priority. The fairness bound under random
priorities is test_properties.py's (its scenarios draw them).

Cluster: load 15 s, unload 3 s: the swap a -> b started at 0 completes at 18 s.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cluster_model import Cluster
from extproc.policy import priority
from harness import Driver, limits, spec

MEMBERS = ("a", "b", "c", "d")


def run(window: float, c_priority: int | None, d_priority: int | None,
        priorities: dict[str, int] | None = None, objective: str = "") -> list[str]:
    """a resident; b asked at 0 (the swap starts), c at 1, d at 2: the swap targets in order."""
    cluster = Cluster(MEMBERS, load_delay=15, unload_delay=3)
    cluster.warm("a")
    d = Driver(spec(MEMBERS, default="a", fairness_window=window,
                    priorities=priorities or {}), limits(), cluster)
    d.start()
    d.request("b", at=0, duration=1)
    d.request("c", at=1, duration=1, priority=c_priority)
    d.request("d", at=2, duration=1, priority=d_priority, objective=objective)
    d.run(until=200)
    return [n.target for n in d.notices("SwapStarted")]


def test_without_priorities_the_oldest_goes_first() -> None:
    assert run(60, None, None)[:3] == ["b", "c", "d"]


def test_the_highest_priority_goes_next() -> None:
    assert run(60, None, 5)[:3] == ["b", "d", "c"]
    assert run(60, -1, None)[:3] == ["b", "d", "c"]  # a negative priority goes after 0


def test_a_request_aged_by_the_fairness_window_goes_first_whatever_the_priorities() -> None:
    # at 18 s, c has waited 17 s: past a 10 s window it is aged, d (5) is not yet
    assert run(10, None, 5)[:3] == ["b", "c", "d"]


def test_the_pools_objective_mapping_gives_the_priority() -> None:
    assert run(60, None, None, {"critical": 7}, objective="critical")[:3] == ["b", "d", "c"]
    assert run(60, None, None, {"critical": 7}, objective="batch")[:3] == ["b", "c", "d"]


@given(st.lists(st.tuples(st.floats(0, 50), st.integers(-3, 3)), min_size=1, max_size=12),
       st.floats(0, 60), st.floats(0, 60))
def test_precedence_orders_aged_by_age_then_priority_then_age(
        held: list[tuple[float, int]], window: float, now: float) -> None:
    cluster = Cluster(("a", "b"), load_delay=15, unload_delay=3)
    d = Driver(spec(("a", "b"), fairness_window=window), limits(), cluster)
    m = d.machine
    for rid, (ago, prio) in enumerate(sorted(held, reverse=True)):
        m.requests.hold(rid, "b", now - ago, now + 300, prio)
    m.now = now
    order = priority.precedence(m)
    assert sorted(map(id, order)) == sorted(map(id, m.requests.held.values()))
    aged = [window > 0 and now - h.arrived >= window for h in order]
    assert aged == sorted(aged, reverse=True)  # every aged request before every other
    for x, y in zip(order, order[1:]):
        x_aged, y_aged = (window > 0 and now - h.arrived >= window for h in (x, y))
        if x_aged and y_aged:
            assert x.arrived <= y.arrived
        elif not x_aged and not y_aged and any(h.priority for h in order):
            assert (-x.priority, x.arrived) <= (-y.priority, y.arrived)


def test_under_the_held_bound_a_negative_priority_is_shed_first() -> None:
    cluster = Cluster(("a", "b"), load_delay=15, unload_delay=3)
    cluster.warm("a")
    d = Driver(spec(("a", "b"), default="a", max_held=2), limits(), cluster)
    d.start()
    low = [d.request("b", at=t, priority=-1) for t in (0, 1)]
    plain = d.request("b", at=2)  # outranks a held -1: held, and the newest -1 is shed
    lower = d.request("b", at=3, priority=-2)  # outranks nobody: refused at once
    d.run()
    shed = d.requests[low[1]]
    # shed for its (sheddable) priority: 429, as the Endpoint Picker Protocol asks
    assert shed.held and (shed.reject.status, shed.reject.code) == (429, "request_shed")
    assert shed.ended == 2 and shed.reject.retry_after >= 1
    assert "priority -1" in shed.reject.message
    refused = d.requests[lower].reject
    assert (refused.status, refused.code) == (429, "request_shed") and refused.retry_after >= 1
    assert "priority -2" in refused.message and not d.requests[lower].held
    assert d.requests[low[0]].state == d.requests[plain].state == "done"


def test_the_held_bound_alone_is_a_503_whatever_the_newcomers_priority() -> None:
    # Nothing sheddable is held: the pool is full, a capacity condition, for a newcomer of
    # priority 0 or more (even a higher one); one of negative priority is shed for it (429)
    cluster = Cluster(("a", "b"), load_delay=15, unload_delay=3)
    cluster.warm("a")
    d = Driver(spec(("a", "b"), default="a", max_held=2), limits(), cluster)
    d.start()
    held = [d.request("b", at=0, priority=5), d.request("b", at=1)]
    full = [d.request("b", at=2), d.request("b", at=3, priority=9),
            d.request("b", at=4, priority=-1)]
    d.run()
    assert [d.requests[r].state for r in held] == ["done", "done"]
    plain, higher, low = (d.requests[r].reject for r in full)
    for refused in (plain, higher):
        assert (refused.status, refused.code) == (503, "too_many_held")
        assert refused.retry_after >= 1 and "priority" not in refused.message
    assert (low.status, low.code) == (429, "request_shed") and low.retry_after >= 1


@given(st.lists(st.tuples(st.floats(0, 17), st.integers(-3, 2)), max_size=12),
       st.integers(1, 4))
def test_the_held_bound_holds_and_only_negative_priorities_are_shed(
        arrivals: list[tuple[float, int]], bound: int) -> None:
    cluster = Cluster(("a", "b"), load_delay=15, unload_delay=3)
    cluster.warm("a")
    d = Driver(spec(("a", "b"), default="a", max_held=bound), limits(), cluster)
    d.start()
    rids = [d.request("b", at=t, priority=p) for t, p in arrivals]
    d.run(until=14)  # while they are held (the swap completes at 18 s)
    assert len(d.machine.held) <= bound
    d.run()
    for rid in rids:
        r = d.requests[rid]
        if r.reject is not None and r.reject.code in ("too_many_held", "request_shed"):
            # the status says the cause: 429 for a sheddable priority, 503 for the bound alone
            assert (r.reject.status, r.reject.code) == \
                ((429, "request_shed") if r.priority < 0 else (503, "too_many_held"))
            assert r.priority < 0 or not r.held  # shed while held: only a negative priority
