"""Minimum residency counted in requests (policy/residency.py): a new resident is not swapped
out at the first pause between its requests, and the fairness window still bounds every wait
(the random scenarios of test_properties.py draw min_residency too).

Cluster: load 15 s, unload 3 s; drain linger cap 2 s; fairness window 30 s.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_model import Cluster
from extproc.policy.events import Scale
from harness import Driver, limits, spec

LOAD, UNLOAD, CAP = 15.0, 3.0, 2.0


def run(min_residency: int, window: float = 30.0) -> tuple[Driver, list[int]]:
    """b takes the slot at 18 s; a request for a arrives at 18.5 s while b's clients send one
    request after another, 0.5 s apart."""
    cluster = Cluster(("a", "b"), load_delay=LOAD, unload_delay=UNLOAD)
    cluster.warm("a")
    d = Driver(spec(("a", "b"), default="a", fairness_window=window,
                    min_residency=min_residency), limits(drain_linger=CAP), cluster)
    d.start()
    d.request("b", at=0, duration=1)
    d.request("a", at=18.5, duration=1)
    later = [d.request("b", at=t, duration=1) for t in (19.5, 21.0, 22.5, 24.0)]
    d.run()
    return d, later


def unloaded_b_at(d: Driver) -> float:
    return next(t for t, c in d.log if c == Scale("b", 0))


def test_without_residency_the_first_pause_gives_the_slot_away() -> None:
    d, later = run(0)
    assert unloaded_b_at(d) == 19.0  # b's first request ended: no returning client yet
    assert d.requests[later[0]].held


def test_the_new_resident_serves_its_first_requests_across_pauses() -> None:
    d, later = run(3)
    # b's released request counts one; the next two pass at once across 0.5 s pauses
    assert [d.requests[r].held for r in later[:2]] == [False, False]
    assert unloaded_b_at(d) > 22.0


def test_the_fairness_window_bounds_the_residency() -> None:
    d, later = run(50, window=3.0)
    # the swap to a waited from 18.5 s: at 21.5 s new requests for b are held, b drains
    assert d.requests[later[1]].waited == 0 and d.requests[later[2]].held
    assert unloaded_b_at(d) <= 18.5 + 3.0 + 1.0 + CAP


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 6), st.floats(0.5, 30), st.lists(st.floats(0.1, 3), max_size=8),
       st.floats(0.05, 1.5))
def test_a_waiting_request_waits_no_longer_than_the_window_allows(
        n: int, window: float, gaps: list[float], duration: float) -> None:
    cluster = Cluster(("a", "b"), load_delay=LOAD, unload_delay=UNLOAD)
    cluster.warm("a")
    d = Driver(spec(("a", "b"), default="a", fairness_window=window, min_residency=n),
               limits(drain_linger=CAP), cluster)
    d.start()
    d.request("b", at=0, duration=duration)
    waiting = d.request("a", at=18.2, duration=1)
    t = 18.0 + duration
    for gap in gaps:
        t += gap
        d.request("b", at=t, duration=duration)
    d.run()
    # the window, one request of b in flight, its linger, then the swap back
    assert d.requests[waiting].waited <= window + duration + CAP + UNLOAD + LOAD + 1e-9
    assert d.requests[waiting].state == "done"
