"""swapPolicy reclaim-down (LLMKube 0.11) by example: an idle resident is drained and unloaded
and the pool is left cold; the next request loads its member from cold.

Every test runs through the invariant-checking Driver (harness.py): at most one member up,
drain before unload, admission only to the resident Ready member. Cluster: load 15 s,
unload 3 s.
"""

from __future__ import annotations

import math

from cluster_model import Cluster, IdleGate
from extproc.policy import replicas
from extproc.policy.events import (ActuationChanged, Admit, DrainAnnounced, Hold,
                                   LeadershipChanged, MemberObserved, RequestArrived, Scale,
                                   StatusObserved, Trigger)
from extproc.policy.machine import PoolMachine
from extproc.policy.model import Actuation, MemberObservation, PoolPhase, PoolStatus
from harness import Driver, limits, spec

LOAD, UNLOAD = 15.0, 3.0


def make(members: tuple[str, ...] = ("a", "b"), *, warm: str = "", knobs=None,
         gate: IdleGate | None = None, **spec_kwargs) -> Driver:
    """A started Driver over a reclaim-down pool (reclaimAfter 60 s) whose default is ``a``."""
    cluster = Cluster(members, load_delay=LOAD, unload_delay=UNLOAD)
    if warm:
        cluster.warm(warm)
    spec_kwargs.setdefault("default", "a")
    spec_kwargs.setdefault("reclaim_after", 60.0)
    d = Driver(spec(members, swap_policy="reclaim-down", **spec_kwargs), knobs or limits(),
               cluster, gate or IdleGate())
    d.start()
    return d


def scales(d: Driver) -> list[tuple[float, Scale]]:
    return [(t, c) for t, c in d.log if isinstance(c, Scale)]


def assert_cold(d: Driver) -> None:
    view = d.machine.view()
    assert d.machine.resident == "" and d.machine.swap is None
    assert (view.resident, view.pending, view.phase) == ("", "", PoolPhase.PENDING)
    assert d.cluster.up() == []


def test_an_idle_resident_is_unloaded_and_the_pool_left_cold() -> None:
    d = make(warm="b")
    d.request("b", at=0, duration=2)
    d.run(until=300)
    # b idle since 2 s: at 62 s it is drained (nothing left) and unloaded; nothing is loaded
    assert scales(d) == [(62.0, Scale("b", 0))]
    assert_cold(d)
    [released] = d.notices("Reclaimed")
    assert (released.source, released.target) == ("b", "")
    assert "reclaim-down" in d.notices("SwapStarted")[-1].message
    assert not d.notices("SwapCompleted")  # a release is not a swap to a member
    assert d.machine.next_deadline() == math.inf  # cold: nothing left to time


def test_the_default_is_released_too() -> None:
    d = make(warm="a")
    d.request("a", at=0, duration=2)
    d.run(until=300)
    assert scales(d) == [(62.0, Scale("a", 0))]
    assert_cold(d)


def test_reclaim_down_is_supported_not_reported() -> None:
    d = make(warm="b")
    d.run(until=100)
    assert d.machine.view().unsupported_policy == ""
    assert not d.notices("UnsupportedSwapPolicy")


def test_the_next_request_cold_starts_its_member() -> None:
    d = make(warm="b")
    d.request("b", at=0, duration=2)
    later = d.request("a", at=200, duration=2)
    d.run(until=300)
    assert d.requests[later].state == "done" and d.requests[later].held
    assert d.requests[later].waited == LOAD  # nothing to drain or unload: only its load
    # and a, idle from 217 s, is released in turn
    assert scales(d) == [(62.0, Scale("b", 0)), (200.0, Scale("a", 1)), (277.0, Scale("a", 0))]
    assert_cold(d)


def test_a_request_during_the_unload_waits_then_loads_its_member() -> None:
    d = make(warm="b")
    d.request("b", at=0, duration=2)
    for_b = d.request("b", at=63, duration=2)  # b is being unloaded (62 s to 65 s)
    for_a = d.request("a", at=64, duration=2)
    d.run(until=300)
    # held; the release under way becomes a swap to b, which loads again at once (no other
    # member holds the GPU), then a's request gets the slot after b's ended
    assert d.requests[for_b].state == "done" and d.requests[for_b].held
    assert d.requests[for_b].ended == 63 + LOAD
    assert scales(d)[:2] == [(62.0, Scale("b", 0)), (63.0, Scale("b", 1))]
    assert d.requests[for_a].state == "done" and d.requests[for_a].held
    assert [n.target for n in d.notices("SwapStarted")][:3] == ["", "b", "a"]
    assert [n.target for n in d.notices("SwapCompleted")][:2] == ["b", "a"]
    assert not [n for n in d.notices("Reclaimed") if n.source == "b"]  # b's release gave way


def test_a_request_for_the_resident_while_draining_cancels_the_release() -> None:
    gate = IdleGate(delay=1.0)  # the idle probe keeps the release in Probing for 1 s
    d = make(warm="b", gate=gate, knobs=limits(idle_gate=True))
    d.request("b", at=0, duration=2)
    late = d.request("b", at=62.5, duration=2)
    d.run(until=100)
    assert d.requests[late].state == "done" and not d.requests[late].held
    assert [n.target for n in d.notices("SwapCancelled")] == [""]
    assert scales(d) == [] and d.machine.resident == "b"
    d.run(until=200)  # idle again once that request ended: released reclaimAfter later
    [(when, scale)] = scales(d)
    assert scale == Scale("b", 0) and when >= 62.5 + 2 + 60
    assert_cold(d)


def test_a_request_for_another_member_while_draining_swaps_straight_to_it() -> None:
    gate = IdleGate(delay=1.0)
    d = make(warm="b", gate=gate, knobs=limits(idle_gate=True))
    d.request("b", at=0, duration=2)
    held = d.request("a", at=62.5, duration=2)
    d.run(until=70)
    assert [n.target for n in d.notices("SwapStarted")] == ["", "a"]
    d.run(until=100)
    assert d.requests[held].state == "done" and d.machine.resident == "a"
    assert not d.notices("Reclaimed")


def test_a_cold_pool_does_not_warm_its_default_under_reclaim_down() -> None:
    d = make()  # every member at 0 at start, default a
    d.run(until=100)
    assert scales(d) == []
    assert_cold(d)
    d.request("a", at=100)
    d.run(until=150)
    assert scales(d) == [(100.0, Scale("a", 1))] and d.machine.resident == "a"


def test_a_release_is_announced_so_followers_admit_nothing() -> None:
    gate = IdleGate(delay=5.0)
    d = make(warm="b", gate=gate, knobs=limits(idle_gate=True))
    d.request("b", at=0, duration=2)
    d.run(until=63)
    assert d.machine.swap is not None and d.machine.swap.target == ""
    assert replicas.announcement(d.machine) == replicas.RELEASING
    assert replicas.RELEASING not in d.machine.spec.members


def test_a_follower_admits_nothing_while_a_release_is_announced() -> None:
    m = PoolMachine(spec(("a", "b"), swap_policy="reclaim-down"), limits(), 0.0,
                    actuation=Actuation.FOLLOW)
    m.handle(LeadershipChanged(False), 0.0)
    m.handle(MemberObserved(MemberObservation("a", phase="Stopped")), 0.0)
    m.handle(MemberObserved(MemberObservation("b", phase="Ready", replicas=1, pods=1)), 0.0)
    m.handle(StatusObserved(PoolStatus(resident="b")), 0.0)
    assert [type(c) for c in m.handle(RequestArrived(1, "b"), 1.0)] == [Admit]
    m.handle(DrainAnnounced(1, replicas.RELEASING), 2.0)
    assert [type(c) for c in m.handle(RequestArrived(2, "b"), 3.0)] == [Hold]
    assert m.swap is None  # nothing to follow: the leader's status says where the slot goes


def test_a_release_under_way_is_dropped_when_the_pool_goes_to_llmkube() -> None:
    gate = IdleGate(delay=5.0)  # the probe keeps the release in Probing
    d = make(warm="b", gate=gate, knobs=limits(idle_gate=True))
    d.request("b", at=0, duration=2)
    d.run(until=63)
    out = d.machine.handle(ActuationChanged(Actuation.LLMKUBE, "test"), 63.0)
    assert d.machine.swap is None or d.machine.swap.target != ""
    assert not [c for c in out if isinstance(c, (Scale, Trigger))]


def test_resident_idle_since_is_shown_for_any_resident() -> None:
    d = make(warm="a", reclaim_after=300, knobs=limits(idle_report=30))
    d.request("a", at=0, duration=2)
    d.run(until=40)
    assert d.machine.view().resident_idle_since == 2.0
