"""The ways out of every state that once wedged a pool, driven by hand event by event.

llmkube mode: a trigger LLMKube's reconciler dropped is noticed and sent again, then given up
with a truthful answer; a trigger LLMKube does not act on is marked stalled and the resident
serves meanwhile. Own mode: a hands-off spell ends by itself after a quiet period (longer for
a pool fought over again) or at once by annotation, and routes to Ready members while it lasts.
The exhaustive search (test_exhaustive.py) checks the same property over every interleaving.
"""

from __future__ import annotations

from dataclasses import replace

from extproc.policy.events import (Admit, Hold, MemberObserved, Notice, Reject, RequestArrived,
                                   Scale, SpecChanged, StatusObserved, Tick, Trigger)
from extproc.policy.machine import PoolMachine
from extproc.policy.model import Actuation, PoolKey, PoolStatus
from extproc.policy.model import MemberObservation as Obs
from harness import two_members

KEY = PoolKey("ns", "pool")
READY = dict(phase="Ready", replicas=1, pods=1)
STOPPED = dict(phase="Stopped", replicas=0, pods=0)
GRACE = 5.0  # the default --activation-grace



machine = two_members  # (harness.py)


def of(out: list, kind: type) -> list:
    return [c for c in out if isinstance(c, kind)]


def notices(out: list) -> list[str]:
    return [n.kind for n in of(out, Notice)]


def lose_trigger(m: PoolMachine, now: float) -> None:
    """Our trigger lands, then LLMKube's stale pass puts b back at 0 with nothing pending."""
    m.handle(MemberObserved(Obs("b", phase="Stopped", replicas=1)), now)
    m.handle(MemberObserved(Obs("b", **STOPPED)), now + 0.02)
    m.handle(StatusObserved(PoolStatus(resident="a")), now + 0.05)


def test_a_dropped_trigger_is_sent_again_after_the_grace() -> None:
    m = machine(Actuation.LLMKUBE)
    assert of(m.handle(RequestArrived(1, "b"), 1.0), Trigger) == [Trigger("b")]
    lose_trigger(m, 1.1)
    assert m.next_deadline() == 1.1 + 0.02 + GRACE  # since the trigger left no trace
    assert not of(m.handle(Tick(), 1.1 + GRACE), Trigger)  # not yet: still within the grace
    out = m.handle(Tick(), m.next_deadline())
    assert of(out, Trigger) == [Trigger("b")] and "ActivationLost" in notices(out)
    # this time LLMKube takes it: pending b, a unloaded, b loaded and named resident
    m.handle(StatusObserved(PoolStatus(resident="a", pending="b")), 7.0)
    m.handle(MemberObserved(Obs("a", **STOPPED)), 8.0)
    m.handle(MemberObserved(Obs("b", **READY)), 9.0)
    out = m.handle(StatusObserved(PoolStatus(resident="b")), 9.1)
    assert [a.rid for a in of(out, Admit)] == [1]


def test_the_reconcilers_own_hold_at_zero_is_not_a_lost_trigger() -> None:
    m = machine(Actuation.LLMKUBE)
    m.handle(RequestArrived(1, "b"), 1.0)
    m.handle(MemberObserved(Obs("b", phase="Stopped", replicas=1)), 1.01)
    m.handle(MemberObserved(Obs("b", **STOPPED)), 1.02)  # held at 0 while a has pods...
    m.handle(StatusObserved(PoolStatus(resident="a", pending="b")), 1.03)  # ...as pending
    assert m.next_deadline() == 1.03 + 120.0  # only the watchdog's: nothing is lost
    out = m.handle(Tick(), 100.0)
    assert not of(out, Trigger) and "ActivationLost" not in notices(out)


def test_a_trigger_dropped_every_time_is_given_up_and_the_incumbent_serves_again() -> None:
    m = machine(Actuation.LLMKUBE)
    m.handle(RequestArrived(1, "b"), 1.0)
    now, triggers = 1.0, 1
    for _ in range(3):
        lose_trigger(m, now + 0.1)
        now = m.next_deadline()
        triggers += len(of(m.handle(Tick(), now), Trigger))
    assert triggers == 4  # the first and three retries, each after twice the last grace
    assert of(m.handle(RequestArrived(2, "a"), now + 0.01), Hold)  # the swap still holds a
    lose_trigger(m, now + 0.1)
    out = m.handle(Tick(), m.next_deadline())
    [refused] = of(out, Reject)
    assert refused.rid == 1 and refused.code == "activation_lost"
    assert "dropped the activation of b 4 times" in refused.message
    assert [a.rid for a in of(out, Admit)] == [2]  # a serves its held request at once
    assert "SwapFailed" in notices(out) and m.swap is None


def test_a_trigger_llmkube_never_acts_on_is_stalled_and_the_resident_serves() -> None:
    m = machine(Actuation.LLMKUBE)
    m.handle(RequestArrived(1, "b"), 1.0)
    m.handle(MemberObserved(Obs("b", phase="Stopped", replicas=1)), 1.05)  # landed, then nothing
    assert of(m.handle(RequestArrived(2, "a"), 2.0), Hold)
    out = m.handle(Tick(), 1.05 + 120.0)  # --stall-after
    assert "SwapStalled" in notices(out)
    assert [a.rid for a in of(out, Admit)] == [2]
    assert of(m.handle(RequestArrived(3, "a"), 130.0), Admit)
    out = m.handle(Tick(), 301.0)  # b's request at its budget hears what is wrong
    [refused] = of(out, Reject)
    assert refused.code == "swap_budget_exceeded" and "is stalled" in refused.message
    assert "continues" not in refused.message


def test_hands_off_routes_to_ready_members_and_resumes_after_a_quiet_period() -> None:
    m = machine()
    out = m.handle(StatusObserved(PoolStatus(resident="a", foreign=True)), 1.0)
    [changed] = [n for n in of(out, Notice) if n.kind == "ActuationChanged"]
    assert "kubectl annotate mpool pool -n ns modelpool.inference.llmkube.dev/resume" \
        in changed.message
    m.handle(MemberObserved(Obs("b", **READY)), 2.0)  # someone brought b up beside a
    assert of(m.handle(RequestArrived(1, "b"), 3.0), Admit)  # the cluster shows it Ready
    assert m.next_deadline() == 2.0 + 300.0  # quiet since that foreign scale-up
    out = m.handle(Tick(), 302.0)
    assert [n.target for n in of(out, Notice) if n.kind == "ActuationChanged"] == ["own"]
    assert m.actuation is Actuation.OWN


def test_hands_off_resumes_at_once_when_the_annotation_changes() -> None:
    m = machine()
    m.handle(StatusObserved(PoolStatus(resident="a", foreign=True)), 1.0)
    refused = of(m.handle(RequestArrived(1, "b"), 2.0), Reject)
    assert [r.code for r in refused] == ["pool_conflict"] and "resumes" in refused[0].message
    out = m.handle(SpecChanged(replace(m.spec, resume="1733000000")), 3.0)
    assert m.actuation is Actuation.OWN and "annotation" in of(out, Notice)[0].message
    out = m.handle(RequestArrived(2, "b"), 4.0)
    assert of(out, Hold) and of(out, Scale) == [Scale("a", 0)]  # swapping again


def test_a_second_spell_soon_after_the_first_lasts_twice_as_long() -> None:
    m = machine()
    m.handle(StatusObserved(PoolStatus(resident="a", foreign=True)), 1.0)
    m.handle(Tick(), 301.0)
    assert m.actuation is Actuation.OWN
    m.handle(StatusObserved(PoolStatus(resident="b", foreign=True)), 310.0)
    assert m.actuation is Actuation.HANDS_OFF and m.next_deadline() == 310.0 + 600.0


def test_a_swap_llmkube_gave_up_that_nobody_waits_for_is_dropped_not_triggered() -> None:
    m = machine(Actuation.LLMKUBE)
    out = m.handle(StatusObserved(PoolStatus(resident="a", pending="b")), 1.0)  # LLMKube's own
    assert "SwapStarted" in notices(out)
    m.handle(StatusObserved(PoolStatus(resident="a")), 2.0)  # and it gave it up again
    out = m.handle(Tick(), m.next_deadline())
    assert notices(out) == ["SwapCancelled"] and not of(out, Trigger) and m.swap is None
    assert of(m.handle(RequestArrived(1, "a"), 8.0), Admit)


def test_a_failed_member_llmkube_keeps_pending_blocks_the_pool_and_requests_hear_why() -> None:
    m = machine(Actuation.LLMKUBE)
    m.handle(RequestArrived(1, "b"), 1.0)
    m.handle(StatusObserved(PoolStatus(resident="a", pending="b")), 1.1)
    m.handle(MemberObserved(Obs("a", **STOPPED)), 2.0)
    m.handle(MemberObserved(Obs("b", phase="Creating", replicas=1, pods=1)), 3.0)
    out = m.handle(MemberObserved(Obs("b", phase="Failed", replicas=1, pods=1)), 4.0)
    assert [r.code for r in of(out, Reject)] == ["member_failed"]
    out = m.handle(RequestArrived(2, "a"), 5.0)  # LLMKube keeps b pending: a cannot load
    [refused] = of(out, Reject)
    assert refused.code == "pool_blocked" and "'b'" in refused.message
    assert not of(out, Trigger) and m.swap is None
