"""Paced release (extproc/policy/pacing.py): a member takes at most its capacity at once.

The Driver (harness.py) checks after every event that no paced member has more in flight than
its capacity and that no held request waits while its serving member has room; these tests
add the release order, the steady state, the peers' counts, the answer at the budget, and
random traffic with swaps and faults.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draws import member_names, random_cluster, random_pool, random_requests
from extproc.policy.events import (Admit, Hold, MemberObserved, PeersObserved, Reject,
                                   RequestArrived, RequestEnded)
from extproc.policy.machine import PoolMachine
from extproc.policy.model import MemberObservation, PeerState, PoolSpec
from harness import KEY, Driver, limits, settle

HORIZON = 200.0


def kinds(out: list, kind: type) -> list:
    return [c for c in out if isinstance(c, kind)]


def paced_pool(capacity: int = 4, paced: bool = True, **spec_kwargs) -> PoolMachine:
    """Pool a, b; a Ready resident taking ``capacity`` at once, b Stopped."""
    m = PoolMachine(PoolSpec(KEY, ("a", "b"), fairness_window=0, **spec_kwargs),
                    limits(paced_release=paced), 0.0)
    m.handle(MemberObserved(MemberObservation("a", phase="Ready", replicas=1, pods=1,
                                              capacity=capacity)), 0.0)
    m.handle(MemberObserved(MemberObservation("b", phase="Stopped", capacity=capacity)), 0.0)
    assert m.resident == "a"
    return m


def test_steady_state_holds_beyond_capacity_and_admits_in_arrival_order() -> None:
    m = paced_pool(capacity=2)
    assert kinds(m.handle(RequestArrived(1, "a"), 1.0), Admit)
    assert kinds(m.handle(RequestArrived(2, "a"), 1.0), Admit)
    for rid in (3, 4, 5):
        assert [c.rid for c in kinds(m.handle(RequestArrived(rid, "a"), 2.0), Hold)] == [rid]
    assert m.requests.busy("a") == 2
    out = m.handle(RequestEnded(2), 3.0)
    assert [(c.rid, c.held_for) for c in kinds(out, Admit)] == [(3, 1.0)]
    # a new arrival queues behind the older held ones
    assert kinds(m.handle(RequestArrived(6, "a"), 3.5), Hold)
    out = m.handle(RequestEnded(1), 4.0)
    assert [c.rid for c in kinds(out, Admit)] == [4]
    m.handle(RequestEnded(3), 5.0)
    m.handle(RequestEnded(4), 5.0)
    assert sorted(m.requests.in_flight) == [5, 6] and not m.held


def test_a_swap_releases_up_to_capacity_then_one_per_end() -> None:
    m = paced_pool(capacity=4)
    held = [rid for rid in range(1, 33) if kinds(m.handle(RequestArrived(rid, "b"), 1.0), Hold)]
    assert held == list(range(1, 33))
    m.handle(MemberObserved(MemberObservation("a", phase="Stopped")), 2.0)  # unloaded
    out = m.handle(MemberObserved(MemberObservation("b", phase="Ready", replicas=1, pods=1,
                                                    capacity=4)), 5.0)
    assert [c.rid for c in kinds(out, Admit)] == [1, 2, 3, 4]
    assert m.resident == "b" and len(m.held) == 28
    released = [1, 2, 3, 4]
    for end, rid in enumerate(range(1, 29), start=6):
        out = m.handle(RequestEnded(rid), float(end))
        released += [c.rid for c in kinds(out, Admit)]
    assert released == list(range(1, 33)) and not m.held


def test_off_releases_everything_at_once_whatever_the_annotation() -> None:
    m = paced_pool(capacity=1, paced=False)
    for rid in range(1, 6):
        assert kinds(m.handle(RequestArrived(rid, "a"), 1.0), Admit)
    assert m.requests.busy("a") == 5


def test_unknown_capacity_is_unpaced() -> None:
    m = paced_pool(capacity=0)
    for rid in range(1, 6):
        assert kinds(m.handle(RequestArrived(rid, "a"), 1.0), Admit)


def test_peers_in_flight_take_room() -> None:
    m = paced_pool(capacity=3)
    m.handle(PeersObserved((PeerState("peer", 0.0, in_flight={"a": 2}),)), 0.5)
    assert kinds(m.handle(RequestArrived(1, "a"), 1.0), Admit)
    assert kinds(m.handle(RequestArrived(2, "a"), 1.0), Hold)
    out = m.handle(PeersObserved((PeerState("peer", 1.5, in_flight={"a": 1}),)), 1.5)
    assert [c.rid for c in kinds(out, Admit)] == [2]
    # a lost peer's counts are unknown, not zero: they no longer count (its Lease is silent)
    m.handle(PeersObserved((PeerState("peer", 1.5, lost=True, in_flight={"a": 1}),)), 2.0)
    assert kinds(m.handle(RequestArrived(3, "a"), 2.0), Admit)


def test_a_paced_request_past_its_budget_hears_the_member_is_full() -> None:
    m = paced_pool(capacity=1, swap_budget=10.0)
    m.handle(RequestArrived(1, "a"), 0.0)
    assert kinds(m.handle(RequestArrived(2, "a"), 0.0), Hold)
    rejects = kinds(m.handle(RequestArrived(3, "a"), 10.0), Reject)
    assert [r.rid for r in rejects] == [2] and rejects[0].code == "swap_budget_exceeded"
    assert "capacity of 1" in rejects[0].message and rejects[0].retry_after >= 1
    assert 3 in m.held  # the newcomer still waits behind the one in flight


def test_the_held_bound_applies_to_paced_requests() -> None:
    m = paced_pool(capacity=1, max_held=1)
    m.handle(RequestArrived(1, "a"), 0.0)
    assert kinds(m.handle(RequestArrived(2, "a"), 0.0), Hold)
    assert kinds(m.handle(RequestArrived(3, "a"), 0.0), Reject)[0].code == "too_many_held"


@st.composite
def paced_drivers(draw: st.DrawFn) -> Driver:
    """A random pool with paced members, swaps, abandons and failed loads, started."""
    members = member_names(draw)
    some = st.sampled_from(members)
    pool = random_pool(draw, members, max_budget=120,
                       max_held=draw(st.none() | st.integers(1, 8)))
    cluster = random_cluster(draw, members, max_capacity=4)
    knobs = limits(paced_release=True, swap_timeout=60.0, idle_gate=draw(st.booleans()),
                   drain_linger=draw(st.sampled_from([0.0, 0.5])))
    d = Driver(pool, knobs, cluster, reuse_rids=draw(st.booleans()))
    d.start()
    random_requests(draw, d, HORIZON, max_size=50)
    for member, at, n in draw(st.lists(st.tuples(some, st.floats(0, HORIZON),
                                                 st.integers(1, 12)), max_size=2)):
        for _ in range(n):  # a burst at one instant: the herd paced release exists for
            d.request(member, at=at, duration=draw(st.floats(0.1, 15)))
    return d


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(paced_drivers())
def test_paced_release_keeps_arrival_order_and_comes_to_rest(d: Driver) -> None:
    settle(d, HORIZON)
    # A held request of a paced member passes before every later one of that member that
    # was held too: arrival order, across swaps and steady state alike.
    for member in d.spec.members:
        if not d.cluster.members[member].capacity:
            continue
        held = [r for r in d.requests.values() if r.member == member and r.held
                and r.state == "done"]
        by_arrival = sorted(held, key=lambda r: (r.arrived, r.rid))
        assert [r.ended for r in by_arrival] == sorted(r.ended for r in by_arrival), member
