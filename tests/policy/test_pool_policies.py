"""The newer pool policies by example: reclaim, unsupported policies, client deadlines, the
held bound, predicted waits per pair and the stalled-swap watchdog.

Every test runs through the invariant-checking Driver (harness.py). Cluster: load 15 s,
unload 3 s, so an idle swap takes 18 s.
"""

from __future__ import annotations

import math
from dataclasses import replace

from cluster_model import STUCK, Cluster, IdleGate
from extproc.policy.events import MemberObserved, Scale, SpecChanged, Tick, Trigger
from extproc.policy.forecast import SwapHistory
from harness import Driver, limits, spec

LOAD, UNLOAD = 15.0, 3.0
SWAP = LOAD + UNLOAD


def make(members: tuple[str, ...] = ("a", "b"), *, warm: str = "", knobs=None,
         cluster: Cluster | None = None, gate: IdleGate | None = None, **spec_kwargs) -> Driver:
    """A started Driver over a pool whose default is ``a``."""
    cluster = cluster or Cluster(members, load_delay=LOAD, unload_delay=UNLOAD)
    if warm:
        cluster.warm(warm)
    spec_kwargs.setdefault("default", "a")
    d = Driver(spec(members, **spec_kwargs), knobs or limits(), cluster, gate or IdleGate())
    d.start()
    return d


# ---- reclaim ------------------------------------------------------------------------------

def test_reclaim_returns_the_slot_to_the_default_after_reclaim_after_idle() -> None:
    d = make(warm="b", swap_policy="reclaim", reclaim_after=60)
    d.request("b", at=0, duration=2)
    d.run(until=200)
    # b idle since 2 s: at 62 s the swap back to a starts, drains nothing, unloads, loads.
    assert (62.0, Scale("b", 0)) in [(t, c) for t, c in d.log if isinstance(c, Scale)]
    assert d.machine.resident == "a"
    [reclaimed] = d.notices("Reclaimed")
    assert (reclaimed.source, reclaimed.target) == ("b", "a")
    assert "reclaim" in d.notices("SwapStarted")[-1].message


def test_sticky_never_reclaims() -> None:
    d = make(warm="b", swap_policy="sticky", reclaim_after=60)
    d.request("b", at=0, duration=2)
    d.run(until=1000)
    assert d.machine.resident == "b" and not d.notices("Reclaimed")
    assert d.machine.next_deadline() == math.inf


def test_a_reclaim_gives_way_to_a_request_for_the_resident() -> None:
    gate = IdleGate(delay=1.0)  # the idle probe keeps the reclaim in Probing for 1 s
    d = make(warm="b", swap_policy="reclaim", reclaim_after=60, gate=gate,
             knobs=limits(idle_gate=True))
    d.request("b", at=0, duration=2)
    late = d.request("b", at=62.5, duration=2)
    d.run(until=100)
    assert d.requests[late].state == "done" and not d.requests[late].held
    assert [n.target for n in d.notices("SwapCancelled")] == ["a"]
    assert not [c for c in d.commands(Scale) if c == Scale("b", 0)]
    assert d.machine.resident == "b" and d.machine.swap is None


def test_a_reclaim_goes_on_when_its_target_is_scaled_up_behind_our_back() -> None:
    # Found by the search (own-reclaim): the target scaled up while the incumbent is probed
    # was taken for an intruder to undo, the reclaim given up and a swap b -> b begun, in the
    # same pass that told a request held for a "the swap continues"
    gate = IdleGate(delay=1.0)
    d = make(warm="b", swap_policy="reclaim", reclaim_after=60, gate=gate,
             knobs=limits(idle_gate=True))
    d.request("b", at=0, duration=2)
    d.at(62.5, lambda: d.cluster.force_up("a", d.now))  # someone scales a up mid-reclaim
    d.run(until=200)
    assert not d.notices("SwapCancelled")
    assert [n.target for n in d.notices("SwapStarted")] == ["a"]
    assert [n.target for n in d.notices("SwapCompleted")] == ["a"]
    assert d.machine.resident == "a"


def test_a_reclaim_gives_way_to_a_request_held_for_another_member() -> None:
    gate = IdleGate(delay=1.0)
    d = make(("a", "b", "c"), warm="b", swap_policy="reclaim", reclaim_after=60, gate=gate,
             knobs=limits(idle_gate=True))
    d.request("b", at=0, duration=2)
    held = d.request("c", at=62.5, duration=2)
    d.run(until=200)
    # the reclaim to a is dropped and the slot goes straight to c, not a then c
    assert d.requests[held].state == "done"
    assert [n.target for n in d.notices("SwapStarted")] == ["a", "c", "a"]
    assert [n.target for n in d.notices("SwapCompleted")] == ["c", "a"]  # then c idles


def test_resident_idle_since_is_shown_once_idle_for_the_report_time_and_cleared_by_a_request(
        ) -> None:
    d = make(warm="b", swap_policy="reclaim", reclaim_after=300, knobs=limits(idle_report=30))
    d.request("b", at=0, duration=2)
    d.run(until=31)
    assert d.machine.view().resident_idle_since is None  # idle 29 s only
    d.run(until=32)
    assert d.machine.view().resident_idle_since == 2.0
    d.request("b", at=40, duration=5)
    d.run(until=41)
    assert d.machine.view().resident_idle_since is None


def test_resident_idle_since_is_only_for_a_non_default_resident_under_reclaim() -> None:
    for swap_policy, warm in (("sticky", "b"), ("reclaim", "a")):
        d = make(warm=warm, swap_policy=swap_policy, knobs=limits(idle_report=30))
        d.request(warm, at=0, duration=2)
        d.run(until=100)
        assert d.machine.view().resident_idle_since is None
        assert d.machine.next_deadline() == math.inf


def test_an_unsupported_policy_runs_sticky_and_is_reported_once() -> None:
    d = make(warm="b", swap_policy="priority", reclaim_after=60)
    d.request("b", at=0, duration=2)
    d.run(until=500)
    assert d.machine.resident == "b" and not d.notices("Reclaimed")
    assert d.machine.view().unsupported_policy == "priority"
    [notice] = d.notices("UnsupportedSwapPolicy")
    assert "priority" in notice.message and "sticky" in notice.message
    d.feed(SpecChanged(replace(d.machine.spec, swap_policy="reclaim")))
    assert d.machine.view().unsupported_policy == ""
    d.run(until=600)
    assert d.notices("Reclaimed") and len(d.notices("UnsupportedSwapPolicy")) == 1


# ---- refusing at once: the client's deadline, the pool's bound -------------------------------

def test_a_deadline_shorter_than_the_expected_wait_is_refused_at_once_and_warms_the_member(
        ) -> None:
    d = make(warm="a", knobs=limits(retry_after_default=7))
    quick = d.request("b", at=0, max_wait=2)
    d.run(until=100)
    reject = d.requests[quick].reject
    assert (reject.code, reject.retry_after, d.requests[quick].waited) == \
        ("max_wait_exceeded", 7, 0)  # no history: the default
    assert d.machine.resident == "b"  # the swap ran anyway: the retry is served warm
    retry = d.request("b", at=100, max_wait=2)
    d.run(until=101)
    assert d.requests[retry].state in ("admitted", "done") and not d.requests[retry].held


def test_the_expected_wait_comes_from_the_pair_history() -> None:
    d = make(warm="a")
    d.request("b", at=0)  # a -> b: 18 s
    d.run(until=50)
    d.cluster.load_delay = 40
    d.request("a", at=50)  # b -> a: 43 s
    d.run(until=200)
    patient = d.request("b", at=200, max_wait=20)  # a -> b expects 18 s: held
    d.run(until=205)
    impatient = d.request("a", at=205, max_wait=20)  # 13 s left of this swap + b -> a 43 s
    d.run(until=206)
    assert d.requests[patient].held
    assert d.requests[impatient].reject.code == "max_wait_exceeded"
    assert d.requests[impatient].reject.retry_after == 13 + 43


def test_a_pool_holds_at_most_its_bound_and_refuses_the_rest_at_once() -> None:
    d = make(warm="a", max_held=2)
    rids = [d.request("b", at=0.1 * i) for i in range(3)]
    d.run(until=1)
    assert [d.requests[r].held for r in rids] == [True, True, False]
    assert d.requests[rids[2]].reject.code == "too_many_held"
    assert d.machine.view().max_held == 2
    d.run()
    assert all(d.requests[r].state == "done" for r in rids[:2])


def test_the_process_bound_applies_when_the_pool_sets_none() -> None:
    d = make(warm="a", knobs=limits(max_held=1))
    rids = [d.request("b", at=0), d.request("b", at=0.5)]
    d.run(until=1)
    assert d.requests[rids[1]].reject.code == "too_many_held"
    assert d.machine.view().max_held == 1


def test_history_falls_back_from_the_pair_to_the_pool_to_the_default() -> None:
    history = SwapHistory(default=5, ceiling=120)
    assert history.expected("a", "b") == 5.0 and history.retry_after("a", "b") == 5
    history.record("a", "b", 10.0)
    history.record("a", "b", 20.0)
    history.record("b", "a", 60.0)
    assert history.expected("a", "b") == 15.0  # its own pair
    assert history.expected("b", "c") == 30.0  # a cold pair: the pool's mean
    assert history.expected("a", "b", elapsed=12) == 3.0
    assert history.retry_after("b", "a", elapsed=500) == 30  # past the slowest: half a mean


# ---- the watchdog ---------------------------------------------------------------------------

def test_a_load_that_stops_moving_is_reported_stalled_and_cleared_when_it_moves() -> None:
    cluster = Cluster(("a", "b"), load_delay=LOAD, unload_delay=UNLOAD, outcome={"b": STUCK})
    d = make(warm="a", cluster=cluster, knobs=limits(stall_after=60, swap_timeout=900))
    d.request("b", at=0, abandon_after=10)
    d.run(until=UNLOAD + 59)
    assert d.machine.view().stalled == ""
    d.run(until=UNLOAD + 61)
    stalled = d.machine.view().stalled
    assert "b" in stalled and "not getting ready" in stalled and "Creating" in stalled
    [warning] = d.notices("SwapStalled")
    assert warning.target == "b"
    assert d.machine.next_deadline() == UNLOAD + 900  # only the swap timeout is left
    moved = replace(d.machine.obs["b"], phase="Progressing")
    d.feed(MemberObserved(moved))
    assert d.machine.view().stalled == "" and d.notices("SwapResumed")


def test_an_unload_whose_pods_never_go_is_reported_stalled() -> None:
    d = make(warm="a", knobs=limits(stall_after=30))
    d.cluster.unload_delay = math.inf  # a pod stuck terminating
    d.request("b", at=0, abandon_after=5)
    d.run(until=31)
    assert "a still has 0 replica(s) and 1 pod(s)" in d.machine.view().stalled


def test_the_idle_report_is_due_exactly_when_the_status_shows_it() -> None:
    # 0.1 + 7.7 - 7.7 rounds below 0.1: a report time derived from the reclaim time came due
    # before track_idle (which adds to the idle start itself) would show it, so its Tick never
    # consumed the deadline (found by the property test).
    d = make(warm="b", swap_policy="reclaim", reclaim_after=7.7, knobs=limits(idle_report=1.0))
    d.request("b", at=0, duration=0.1)
    d.run(until=5)  # the harness fails a deadline that stays at or before now
    assert d.machine.idle_shown == 0.1 and d.machine.view().resident_idle_since == 0.1
    assert d.machine.next_deadline() == 0.1 + 7.7


# ---- reclaim is own mode's --------------------------------------------------------------------

def _llmkube_pool_with_idle_b(now: float = 0.0):
    """A machine in llmkube mode whose status names b (not the default a) resident."""
    from extproc.policy.events import StatusObserved
    from extproc.policy.machine import PoolMachine
    from extproc.policy.model import Actuation, MemberObservation, PoolStatus

    m = PoolMachine(spec(("a", "b"), default="a", swap_policy="reclaim", reclaim_after=60),
                    limits(idle_report=1.0), now, actuation=Actuation.LLMKUBE)
    out = m.handle(MemberObserved(MemberObservation("a", phase="Stopped")), now)
    out += m.handle(MemberObserved(MemberObservation("b", phase="Ready", replicas=1, pods=1)),
                    now)
    out += m.handle(StatusObserved(PoolStatus(resident="b", foreign=True)), now)
    return m, out


def test_llmkube_mode_leaves_reclaim_to_llmkube() -> None:
    m, out = _llmkube_pool_with_idle_b()
    assert m.resident == "b"
    # LLMKube reclaims (and writes residentIdleSince); we neither swap nor report
    assert m.next_deadline() == math.inf
    out += m.handle(Tick(), 1000.0)
    assert m.swap is None and not [c for c in out if isinstance(c, (Scale, Trigger))]
    assert m.view().resident_idle_since is None and m.view().unsupported_policy == ""


def test_a_reclaim_under_way_is_dropped_when_the_pool_goes_to_llmkube() -> None:
    from extproc.policy.events import ActuationChanged, Notice
    from extproc.policy.model import Actuation

    gate = IdleGate(delay=5.0)  # the probe keeps the reclaim in Probing
    d = make(warm="b", swap_policy="reclaim", reclaim_after=60, gate=gate,
             knobs=limits(idle_gate=True))
    d.request("b", at=0, duration=2)
    d.run(until=63)
    assert d.machine.swap is not None and d.machine.swap.reclaim
    out = d.machine.handle(ActuationChanged(Actuation.LLMKUBE, "test"), 63.0)
    # the reclaim to a is gone (what follows is LLMKube's: with an empty status it sees b up
    # and not resident, and follows that), and nothing was scaled or triggered for it
    assert d.machine.swap is None or d.machine.swap.target != "a"
    assert "SwapCancelled" in [c.kind for c in out if isinstance(c, Notice)]
    assert not [c for c in out if isinstance(c, (Scale, Trigger))]
