"""PoolMachine by example: one test per behaviour of docs/design/contract.md's rules 1-7.

Every test runs through the invariant-checking Driver, so each also checks that no two members
are up, nothing is admitted to a non-Ready member and nothing busy is scaled down. Cluster
defaults: load 15 s, unload 3 s, so an idle swap takes 18 s.
"""

from __future__ import annotations

import math

import pytest

from cluster_model import FAILS, STUCK, Cluster, IdleGate
from extproc.policy.events import (Admit, Hold, MemberObserved, ProbeIdle, Reject,
                                   RequestArrived, RequestEnded, Scale, SpecChanged, Tick)
from extproc.policy.machine import Limits, PolicyError
from extproc.policy.model import MemberObservation, PoolPhase
from harness import Driver, limits, spec

LOAD, UNLOAD = 15.0, 3.0
SWAP = LOAD + UNLOAD


def make(members: tuple[str, ...] = ("a", "b"), *, limits: Limits = limits(),
         cluster: Cluster | None = None, gate: IdleGate | None = None, warm: str = "",
         resident_hint: str = "", pending_hint: str = "", **spec_kwargs) -> Driver:
    """A started Driver; ``warm`` names a member already Ready when the process starts."""
    cluster = cluster or Cluster(members, load_delay=LOAD, unload_delay=UNLOAD)
    if warm:
        cluster.warm(warm)
    d = Driver(spec(members, **spec_kwargs), limits, cluster, gate or IdleGate(),
               resident_hint=resident_hint, pending_hint=pending_hint)
    d.start()
    return d


def scales(d: Driver) -> list[tuple[float, Scale]]:
    """Every Scale command with the time it was issued."""
    return [(t, c) for t, c in d.log if isinstance(c, Scale)]


def admitted_at(d: Driver, rid: int) -> float:
    """When request ``rid`` was admitted (fails the test if it was not)."""
    req = d.requests[rid]
    assert req.state in ("admitted", "done"), req
    return req.ended


# ---- rule 2: cold pool ---------------------------------------------------------------------


def test_cold_pool_warms_the_default_member() -> None:
    d = make(default="b")
    d.run(until=5)
    assert d.machine.view().phase is PoolPhase.SWAPPING and d.machine.view().pending == "b"
    d.run(until=100)
    assert scales(d) == [(0.0, Scale("b", 1))]
    assert d.machine.view().phase is PoolPhase.READY and d.machine.resident == "b"


def test_without_default_the_first_request_picks_the_owner() -> None:
    d = make()
    d.run(until=100)
    assert d.log == [] and d.machine.view().phase is PoolPhase.PENDING
    rid = d.request("b")
    d.run(until=200)
    assert scales(d) == [(100.0, Scale("b", 1))]
    assert admitted_at(d, rid) == 100 + LOAD and d.machine.resident == "b"


# ---- rules 1 and 3: sticky, coalescing -----------------------------------------------------


def test_sticky_no_automatic_return_to_default() -> None:
    d = make(default="a")
    d.request("b", at=50)
    d.run(until=5000)
    assert [c for _, c in scales(d)] == [Scale("a", 1), Scale("a", 0), Scale("b", 1)]
    assert d.machine.resident == "b" and d.machine.view().phase is PoolPhase.READY


def test_same_model_requests_during_a_swap_share_one_swap() -> None:
    d = make(warm="a")
    rids = [d.request("b", at=t) for t in (0, 1, 2, 5)]
    d.run()
    assert len(d.notices("SwapStarted")) == 1
    assert [c for _, c in scales(d)] == [Scale("a", 0), Scale("b", 1)]
    assert [d.requests[r].coalesced for r in rids] == [False, True, True, True]
    assert all(admitted_at(d, r) == SWAP for r in rids)


def test_requests_for_the_resident_pass_at_once_and_never_swap() -> None:
    d = make(warm="a")
    rids = [d.request("a", at=t, duration=3) for t in range(5)]
    d.run()
    assert [d.requests[r].waited for r in rids] == [0.0] * 5
    assert d.commands(Hold) == [] and d.notices("SwapStarted") == [] and scales(d) == []


def test_cross_model_request_waits_for_the_incumbents_requests_to_finish() -> None:
    d = make(warm="a")
    d.request("a", at=0, duration=10)
    late = d.request("a", at=5, duration=4)  # within the fairness window: still served
    b = d.request("b", at=1)
    d.run(until=9.5)
    assert scales(d) == [] and d.machine.resident == "a"
    assert d.requests[late].waited == 0.0
    d.run()
    assert scales(d)[0] == (10.0, Scale("a", 0))  # the slot flips at zero in flight
    assert admitted_at(d, b) == 10 + SWAP


def test_one_swap_at_a_time_and_a_third_member_waits_for_the_next_swap() -> None:
    d = make(("a", "b", "c"), warm="a")
    b = d.request("b", at=0, duration=2)
    c = d.request("c", at=1)
    d.run(until=10)
    assert d.machine.swap is not None and d.machine.swap.target == "b"
    assert d.requests[c].state == "held"
    d.run()
    assert [n.target for n in d.notices("SwapStarted")] == ["b", "c"]
    assert admitted_at(d, b) == SWAP
    # c's swap starts when b is Ready, drains b's admitted request (2 s), then unloads/loads.
    assert admitted_at(d, c) == SWAP + 2 + SWAP
    assert [c for _, c in scales(d)] == [Scale("a", 0), Scale("b", 1), Scale("b", 0),
                                         Scale("c", 1)]


def test_all_held_requests_for_the_target_are_released_together() -> None:
    d = make(warm="a")
    rids = [d.request("b", at=t) for t in (0, 4, 9)]
    d.run()
    admits = [(t, c) for t, c in d.log if isinstance(c, Admit)]
    assert admits == [(SWAP, Admit(r, "b", SWAP - t, "a->b")) for r, t in zip(rids, (0, 4, 9))]
    assert d.notices("SwapCompleted")[0].released == 3


# ---- rule 5: budget and Retry-After --------------------------------------------------------


def test_budget_rejects_with_503_and_the_swap_still_completes() -> None:
    d = make(warm="a", swap_budget=10)
    rid = d.request("b", at=0)
    d.run(until=11)
    reject = d.requests[rid].reject
    assert reject is not None and d.requests[rid].ended == 10
    assert (reject.status, reject.code, reject.held_for) == (503, "swap_budget_exceeded", 10)
    assert reject.retry_after >= 1
    d.run(until=30)
    assert d.machine.resident == "b"  # nobody waited any more, yet the swap finished
    nxt = d.request("b")
    d.run()
    assert d.requests[nxt].waited == 0.0


@pytest.mark.parametrize("cap, expected", [(120, SWAP - 10), (6, 6)])
def test_retry_after_comes_from_swap_history_clamped(cap: int, expected: float) -> None:
    d = make(warm="a", swap_budget=10,
             limits=limits(retry_after_default=7, retry_after_max=cap))
    first = d.request("b", at=0)
    d.run()
    assert d.requests[first].reject.retry_after == 7  # no history yet: the default
    second = d.request("a", at=100)
    d.run()
    # One 18 s swap in history, 10 s of this one gone: 8 s expected (or the cap).
    assert d.requests[second].reject.retry_after == expected


def test_retry_after_for_an_overdue_swap_is_half_a_usual_swap() -> None:
    d = make(warm="a", swap_budget=30)
    d.request("b", at=0)
    d.run()
    d.cluster.load_delay = 100
    slow = d.request("a", at=100)
    d.run()
    # 18 s usual (and slowest), 30 s already gone: not "1 s", which would invite a retry
    # storm against a slow load, but half a usual swap.
    assert d.requests[slow].reject.retry_after == math.ceil(SWAP / 2)


def test_retry_after_expects_the_slowest_swap_seen_once_past_the_mean() -> None:
    d = make(warm="a", swap_budget=20)
    d.request("b", at=0)  # an 18 s swap
    d.run()
    d.cluster.load_delay = 40
    d.request("a", at=100)  # a 43 s swap
    d.run()
    d.cluster.load_delay = 100
    slow = d.request("b", at=300)
    d.run()
    # Per pair: a -> b took 18 s (the 43 s swap was b -> a). 20 s gone is past even the
    # slowest a -> b seen, so another half of a usual one: 9 s. The pool's history
    # ((18 + 43) / 2 = 30.5 s) would have said 11 s.
    assert d.requests[slow].reject.retry_after == 9


def test_drain_linger_batches_back_to_back_requests_for_the_incumbent() -> None:
    d = make(warm="a", swap_budget=200, fairness_window=30,
             limits=limits(drain_linger=0.5))
    # a client sending to the incumbent back to back: each request 2 s, 0.1 s apart; it
    # has come back once (at 2.1 s) when the cross-model request arrives at 3 s
    follow = [d.request("a", at=2.1 * i, duration=2) for i in range(20)]
    cross = d.request("b", at=3)
    d.run()
    served_at_once = [r for r in follow if not d.requests[r].held]
    # The incumbent kept the slot through the 0.1 s gaps (its linger is 2 x 0.1 s) until
    # the window, 30 s after the swap started, ended ...
    assert len(served_at_once) == 16  # arrivals at 0 ... 31.5 s
    assert all(d.requests[r].arrived < 33 for r in served_at_once)
    # ... then drained, and the waiting request got the slot right after.
    last_done = max(d.requests[r].arrived for r in served_at_once) + 2
    assert admitted_at(d, cross) == last_done + SWAP


def test_an_incumbent_without_returning_clients_gives_the_slot_up_at_once() -> None:
    d = make(warm="a", swap_budget=200, fairness_window=30,
             limits=limits(drain_linger=0.5))
    first = d.request("a", at=0, duration=2)
    cross = d.request("b", at=1)
    d.run()
    # No request for "a" ever came back after one ended: no linger, unload at its end.
    assert (2.0, Scale("a", 0)) in scales(d)
    assert admitted_at(d, first) == 0 and admitted_at(d, cross) == 2 + SWAP


def test_a_client_alternating_between_members_earns_no_linger() -> None:
    # Fast swaps (0.1 s unload, 0.1 s load): a client that asks a, then b once a answered,
    # then a again once b answered. Its next request for a member always comes after the
    # other member served it, so lingering for it would only delay the swap it waits for.
    cluster = Cluster(("a", "b"), load_delay=0.1, unload_delay=0.1)
    d = make(cluster=cluster, warm="a", swap_budget=20, limits=limits(drain_linger=0.5))
    for member, at in (("a", 0), ("b", 0.06), ("a", 0.32), ("b", 0.58)):
        d.request(member, at=at, duration=0.05)
    d.run()
    # each swap starts as its request arrives: the incumbent's last request had ended
    assert [(round(t, 2), c) for t, c in scales(d) if c.replicas == 0] == [
        (0.06, Scale("a", 0)), (0.32, Scale("b", 0)), (0.58, Scale("a", 0))]
    assert d.machine.requests.linger("a", 0.6, 0.5) == 0.0


def test_the_linger_follows_the_gaps_and_never_exceeds_its_cap() -> None:
    d = make(warm="a", swap_budget=200, fairness_window=30,
             limits=limits(drain_linger=0.5))
    # returns 0.2 s and then 0.4 s after an end: lingers of 0.4 s, then the 0.5 s cap
    for at in (0, 2.2, 4.6):
        d.request("a", at=at, duration=2)
    d.run(until=7)
    book = d.machine.requests
    assert book.linger("a", 7, 0.5) == 0.5
    assert book.linger("a", 7, 1.0) == pytest.approx(0.8)
    assert book.linger("b", 7, 0.5) == 0.0  # never served: no returns
    assert book.linger("a", 4.6 + 20 * 0.5 + 0.1, 0.5) == 0.0  # forgotten after 20 caps


def test_a_returning_client_earns_at_least_a_tenth_of_the_cap() -> None:
    # A client back 1 ms after each answer: twice its gap (2 ms) would not cover the tens of
    # milliseconds a loaded machine adds to any gap, so its incumbent keeps the slot 50 ms.
    d = make(warm="a", swap_budget=200, fairness_window=30, limits=limits(drain_linger=0.5))
    first = d.request("a", at=0, duration=2)
    d.request("a", at=2.001, duration=2)
    cross = d.request("b", at=3)
    d.run()
    assert d.machine.requests.linger("a", 4.1, 0.5) == pytest.approx(0.05)
    assert (4.051, Scale("a", 0)) in [(round(t, 3), c) for t, c in scales(d)]
    assert admitted_at(d, first) == 0 and admitted_at(d, cross) == pytest.approx(4.051 + SWAP)


# ---- failures ------------------------------------------------------------------------------


def test_failed_target_rejects_fast_then_backs_off_then_recovers() -> None:
    cluster = Cluster(("a", "b"), load_delay=LOAD, unload_delay=UNLOAD, outcome={"b": FAILS})
    d = make(cluster=cluster, warm="a", limits=limits(failure_backoff=30))
    held = d.request("b", at=0)
    during_backoff = d.request("b", at=20)
    d.run(until=25)
    reject = d.requests[held].reject
    assert (reject.code, d.requests[held].ended, reject.retry_after) == ("member_failed",
                                                                         SWAP, 30)
    assert (SWAP, Scale("b", 0)) in scales(d)
    fast = d.requests[during_backoff]
    assert fast.reject.code == "member_failed" and fast.waited == 0
    assert fast.reject.retry_after == math.ceil(SWAP + 30 - 20)
    assert d.machine.view().failed_member == "b"
    cluster.outcome.clear()
    retry = d.request("b", at=SWAP + 30)
    d.run()
    assert admitted_at(d, retry) == SWAP + 30 + LOAD
    assert d.machine.view().failed_member == ""


def test_stuck_creating_times_out_and_the_pool_is_not_wedged() -> None:
    cluster = Cluster(("a", "b"), load_delay=LOAD, unload_delay=UNLOAD, outcome={"b": STUCK})
    d = make(cluster=cluster, warm="a", limits=limits(swap_timeout=60))
    stuck = d.request("b", at=0)
    d.run(until=UNLOAD + 60 + 1)
    reject = d.requests[stuck].reject
    assert reject.code == "member_failed" and "60s" in reject.message
    assert d.requests[stuck].ended == UNLOAD + 60
    assert (UNLOAD + 60, Scale("b", 0)) in scales(d)
    back = d.request("a", at=100)
    d.run()
    assert admitted_at(d, back) == 100 + LOAD
    assert d.machine.view().phase is PoolPhase.READY


# ---- fairness ------------------------------------------------------------------------------


def steady(d: Driver, member: str, start: int, stop: int) -> list[int]:
    """One 2 s request for ``member`` every second: it always has a request in flight."""
    return [d.request(member, at=t, duration=2) for t in range(start, stop)]


def test_fairness_window_holds_the_incumbent_after_the_window() -> None:
    d = make(warm="a", fairness_window=30)
    a = steady(d, "a", 0, 120)
    b = d.request("b", at=10)
    d.run()
    # a keeps being served until the swap has waited 30 s (t=40); the last one admitted
    # (t=39) ends at 41, then unload and load.
    assert admitted_at(d, b) == 41 + SWAP
    assert all(d.requests[r].waited == 0 for r in a[:40])
    assert all(d.requests[r].held for r in a[40:41 + int(SWAP)])
    assert all(d.requests[r].state == "done" for r in a)  # held, never rejected
    assert d.requests[b].waited <= 30 + 2 + SWAP


def test_fairness_window_zero_is_pure_coalescing_and_starves_until_budget() -> None:
    d = make(warm="a", fairness_window=0, swap_budget=60)
    a = steady(d, "a", 0, 120)
    b = d.request("b", at=10)
    d.run(until=120.5)
    assert d.requests[b].reject.code == "swap_budget_exceeded"
    assert d.requests[b].ended == 70
    assert scales(d) == [] and all(d.requests[r].waited == 0 for r in a)
    d.run()  # a's traffic stopped: the swap b asked for still completes (rule 5)
    assert scales(d)[0] == (121.0, Scale("a", 0)) and d.machine.resident == "b"


# ---- rule 7: self-heal ---------------------------------------------------------------------


def test_resident_lost_out_of_band_and_the_next_request_swaps_it_back() -> None:
    d = make(warm="a")
    d.at(10, lambda: d.cluster.kill("a", d.now))
    rid = d.request("a", at=10.5)
    d.run()
    assert [n.source for n in d.notices("MemberLost")] == ["a"]
    assert d.requests[rid].held and [n.target for n in d.notices("SwapStarted")] == ["a"]
    # The controller recreates the pod 1 s after the kill; it is served once Ready again.
    assert admitted_at(d, rid) == 11 + LOAD
    assert scales(d) == [] and d.machine.resident == "a"


def test_a_resident_that_left_ready_is_no_longer_routed_to() -> None:
    d = make(warm="a")
    d.at(10, lambda: d.cluster.kill("a", d.now))
    d.run(until=10.5)  # killed, not yet back (the controller recreates it 1 s later)
    assert d.machine.resident == "" and d.machine.view().resident in ("", None)
    assert [n.source for n in d.notices("MemberLost")] == ["a"]


def test_resident_that_reloads_by_itself_is_adopted_again() -> None:
    d = make(warm="a")
    d.at(10, lambda: d.cluster.kill("a", d.now))
    d.run(until=11 + LOAD + 1)
    assert d.machine.resident == "a" and d.notices("SwapStarted") == []
    rid = d.request("a")
    d.run()
    assert d.requests[rid].waited == 0


# ---- rule 6: Degraded ----------------------------------------------------------------------


def test_degraded_pool_serves_the_resident_and_makes_no_replica_changes() -> None:
    d = make(("a", "b", "c"), warm="a")
    d.at(5, lambda: d.cluster.delete("c"))
    ok = d.request("a", at=6)
    refused = d.request("b", at=7)
    d.run(until=10)
    view = d.machine.view()
    assert view.phase is PoolPhase.DEGRADED and view.missing_members == ("c",)
    assert d.requests[ok].waited == 0
    assert d.requests[refused].reject.code == "pool_degraded"
    assert scales(d) == []
    d.at(20, lambda: d.cluster.recreate("c"))
    later = d.request("b", at=21)
    d.run()
    assert admitted_at(d, later) == 21 + SWAP


def test_degraded_mid_swap_pauses_the_swap_until_the_member_is_back() -> None:
    d = make(("a", "b", "c"), warm="a")
    rid = d.request("b", at=0)
    d.at(1, lambda: d.cluster.delete("c"))
    d.at(50, lambda: d.cluster.recreate("c"))
    d.run(until=49)
    assert [c for _, c in scales(d)] == [Scale("a", 0)]  # nothing scaled up while Degraded
    d.run()
    assert (50.0, Scale("b", 1)) in scales(d) and admitted_at(d, rid) == 50 + LOAD


# ---- adoption at start-up ------------------------------------------------------------------


def test_start_up_adopts_the_hinted_resident() -> None:
    d = make(warm="b", resident_hint="b")
    assert d.machine.resident == "b" and d.machine.view().phase is PoolPhase.READY
    rid = d.request("b")
    d.run()
    assert d.requests[rid].waited == 0 and d.log[-1] == (0.0, Admit(rid, "b"))


def test_start_up_adopts_a_ready_member_without_hint() -> None:
    d = make(warm="b", default="a")
    d.run(until=100)
    assert d.machine.resident == "b" and scales(d) == []  # no default warm-up over it


def test_start_up_resumes_the_pending_swap() -> None:
    d = make(warm="a", resident_hint="a", pending_hint="b")
    d.run()
    assert [n.target for n in d.notices("SwapStarted")] == ["b"]
    assert scales(d) == [(0.0, Scale("a", 0)), (UNLOAD, Scale("b", 1))]
    assert d.machine.resident == "b"


def test_start_up_with_two_members_up_converges_to_one() -> None:
    cluster = Cluster(("a", "b"), load_delay=LOAD, unload_delay=UNLOAD)
    cluster.warm("a")
    cluster.out_of_band = True  # the state we start from breaks invariant 1 already
    d = make(cluster=cluster, warm="b", resident_hint="b")
    rid = d.request("b")
    d.run()
    assert scales(d) == [(0.0, Scale("a", 0))] and cluster.up() == ["b"]
    assert d.requests[rid].waited == 0 and d.machine.resident == "b"


# ---- the idle gate (rule 4, fail closed) ---------------------------------------------------


@pytest.mark.parametrize("answer, reason", [(False, "PodsBusy"), (None, "IdleCheckFailed")])
def test_idle_gate_defers_the_swap_until_the_incumbent_is_idle(answer: bool | None,
                                                               reason: str) -> None:
    gate = IdleGate(delay=0.1)
    gate.scripts["a"] = [answer, answer, True]
    d = make(warm="a", gate=gate, limits=limits(idle_gate=True))
    rid = d.request("b", at=0)
    d.run(until=2)
    assert d.machine.view().deferred_reason == reason
    assert [n.source for n in d.notices("SwapDeferred")] == [reason]
    assert scales(d) == [] and d.commands(ProbeIdle) == [ProbeIdle("a")] * 2
    d.run()
    first_scale = scales(d)[0]
    assert first_scale[1] == Scale("a", 0) and first_scale[0] > 2.2  # after the third probe
    assert gate.asked == ["a"] * 3 and d.machine.view().deferred_reason == ""
    assert admitted_at(d, rid) == pytest.approx(first_scale[0] + SWAP)


# ---- impossible events ---------------------------------------------------------------------


@pytest.mark.parametrize("event", [
    RequestEnded(99),
    RequestArrived(1, "nobody"),
    MemberObserved(MemberObservation("nobody")),
])
def test_impossible_events_raise_policy_error(event) -> None:
    d = make(warm="a")
    with pytest.raises(PolicyError):
        d.machine.handle(event, 1.0)


def test_a_request_id_arriving_twice_raises_policy_error() -> None:
    d = make(warm="a")
    d.machine.handle(RequestArrived(1, "a"), 1.0)
    with pytest.raises(PolicyError):
        d.machine.handle(RequestArrived(1, "b"), 2.0)
    assert d.commands(Reject) == []


# ---- regressions: bugs the driver and the property tests found in machine.py ---------------


def test_end_of_failure_backoff_is_a_deadline_and_changes_the_view() -> None:
    cluster = Cluster(("a", "b"), load_delay=LOAD, unload_delay=UNLOAD, outcome={"b": FAILS})
    d = make(cluster=cluster, warm="a", limits=limits(failure_backoff=30))
    d.request("b", at=0)
    d.run(until=SWAP + 1)
    assert d.machine.view().failed_member == "b"
    # The status shows the failure only while the backoff runs: its end must wake the
    # runtime (which republishes when the view changes), or the status keeps a stale failure.
    assert d.machine.next_deadline() == SWAP + 30
    d.run(until=SWAP + 31)
    assert d.machine.view().failed_member == ""


def test_degraded_during_load_still_hands_the_slot_to_a_ready_target() -> None:
    d = make(("a", "b", "c"), warm="a")
    rid = d.request("b", at=0)
    d.at(10, lambda: d.cluster.delete("c"))
    d.run(until=1000)
    assert admitted_at(d, rid) == SWAP and d.machine.resident == "b"
    assert d.machine.view().phase is PoolPhase.DEGRADED
    assert [t for t, _ in scales(d)] == [0.0, UNLOAD]  # nothing after c went missing


def test_degraded_pool_does_not_scale_down_a_target_that_timed_out() -> None:
    cluster = Cluster(("a", "b", "c"), load_delay=LOAD, unload_delay=UNLOAD,
                      outcome={"b": STUCK})
    d = make(("a", "b", "c"), cluster=cluster, warm="a", limits=limits(swap_timeout=60))
    rid = d.request("b", at=0)
    d.at(10, lambda: d.cluster.delete("c"))
    d.run(until=100)
    assert d.requests[rid].reject.code == "member_failed"
    assert [t for t, _ in scales(d)] == [0.0, UNLOAD]  # invariant 6
    d.at(100, lambda: d.cluster.recreate("c"))
    back = d.request("a", at=101)
    d.run()
    # The next swap unloads the stuck member first, then loads a.
    assert [c for _, c in scales(d)][2:] == [Scale("b", 0), Scale("a", 1)]
    assert admitted_at(d, back) == 101 + SWAP


def test_removing_the_swap_target_from_the_pool_abandons_the_swap() -> None:
    d = make(("a", "b", "c"), warm="a")
    rid = d.request("b", at=0)
    d.at(1, lambda: d.feed(SpecChanged(spec(("a", "c"), generation=2))))
    back = d.request("a", at=5)
    d.run()
    assert d.requests[rid].reject.status == 404
    assert admitted_at(d, back) == 5 + LOAD and d.machine.resident == "a"


def test_incumbent_scaled_up_behind_our_back_during_unload_is_scaled_down_again() -> None:
    d = make(warm="a")
    rid = d.request("b", at=0)
    d.at(1, lambda: d.cluster.force_up("a", d.now))
    d.run()
    assert [c for _, c in scales(d)] == [Scale("a", 0), Scale("a", 0), Scale("b", 1)]
    assert admitted_at(d, rid) == 1 + SWAP and d.cluster.up() == ["b"]


def test_a_reused_request_id_is_held_for_its_own_full_budget() -> None:
    # The cluster is not driven here, so the unload never moves: keep the watchdog out.
    d = make(warm="a", swap_budget=100, limits=limits(stall_after=1000))
    m = d.machine
    # Ids are unique only while a request lives: the runtime may reuse one once it ended.
    assert isinstance(m.handle(RequestArrived(7, "b"), 0.0)[0], Hold)
    m.handle(RequestEnded(7), 1.0)  # the client left
    assert m.handle(RequestArrived(7, "b"), 50.0)[0] == Hold(7, "b", 150.0, True)
    assert m.next_deadline() == 150.0
    assert not [c for c in m.handle(Tick(), 100.0) if isinstance(c, Reject)]
    assert [c.code for c in m.handle(Tick(), 150.0) if isinstance(c, Reject)] == \
        ["swap_budget_exceeded"]


def test_a_probe_retry_that_falls_due_while_degraded_does_not_stay_due() -> None:
    gate = IdleGate(delay=0.1)
    gate.scripts["a"] = [False]
    d = make(("a", "b", "c"), warm="a", gate=gate, limits=limits(idle_gate=True))
    rid = d.request("b", at=0)
    d.at(0.5, lambda: d.cluster.delete("c"))
    d.run(until=5)  # the driver fails if next_deadline() stays at or before now
    assert d.machine.next_deadline() == 300.0  # only the held request's budget is left
    d.at(10, lambda: d.cluster.recreate("c"))
    d.run()
    assert gate.asked == ["a", "a"] and admitted_at(d, rid) == 10.1 + SWAP


def test_a_failed_swap_to_the_resident_itself_leaves_no_resident() -> None:
    # Two members up at start: the machine keeps the hinted resident and unloads the other.
    cluster = Cluster(("a", "b"), load_delay=1, unload_delay=UNLOAD, outcome={"a": FAILS})
    cluster.warm("b")
    cluster.out_of_band = True
    d = make(cluster=cluster, warm="a", resident_hint="a")
    d.at(0.5, lambda: cluster.kill("a", d.now))  # then it reloads and fails
    d.run(until=10)
    assert [n.target for n in d.notices("SwapFailed")] == ["a"]
    assert d.machine.resident == "" and d.machine.view().resident == ""
