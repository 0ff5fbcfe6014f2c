"""spec.swapDelay (fairness.held_until): a member that became resident keeps the slot at least
that long before a cross-model swap unloads it; the fairness window still bounds every wait;
in llmkube mode the field is LLMKube's reconciler's, and the trigger is not held."""

from __future__ import annotations

from extproc.policy.events import MemberObserved, RequestArrived, Scale, StatusObserved, Tick, Trigger
from extproc.policy.machine import PoolMachine
from extproc.policy.model import Actuation, PoolKey, PoolSpec, PoolStatus, StartHints
from extproc.policy.model import MemberObservation as Obs
from harness import limits

KEY = PoolKey("ns", "pool")
READY = dict(phase="Ready", replicas=1, pods=1)
STOPPED = dict(phase="Stopped", replicas=0, pods=0)


def machine(delay: float, fairness: float = 0.0,
            actuation: Actuation = Actuation.OWN) -> PoolMachine:
    """a resident since 0 and Ready, b Stopped."""
    m = PoolMachine(PoolSpec(KEY, ("a", "b"), fairness_window=fairness, swap_delay=delay),
                    limits(), 0.0, StartHints(resident="a"), actuation=actuation)
    if actuation is Actuation.LLMKUBE:
        m.handle(StatusObserved(PoolStatus(resident="a")), 0.0)
    m.handle(MemberObserved(Obs("a", **READY)), 0.0)
    m.handle(MemberObserved(Obs("b", **STOPPED)), 0.0)
    return m


def scaled_down(out: list) -> bool:
    return Scale("a", 0) in out


def test_the_resident_keeps_the_slot_for_the_swap_delay() -> None:
    m = machine(delay=10.0)
    out = m.handle(RequestArrived(1, "b"), 1.0)
    assert not scaled_down(out) and m.swap is not None  # the swap waits, a keeps serving
    assert m.next_deadline() == 10.0
    assert not scaled_down(m.handle(Tick(), 9.9))
    assert scaled_down(m.handle(Tick(), 10.0))


def test_without_a_delay_the_swap_unloads_at_once() -> None:
    assert scaled_down(machine(delay=0.0).handle(RequestArrived(1, "b"), 1.0))


def test_a_resident_held_long_enough_gives_way_at_once() -> None:
    assert scaled_down(machine(delay=10.0).handle(RequestArrived(1, "b"), 12.0))


def test_the_fairness_window_bounds_the_hold() -> None:
    m = machine(delay=60.0, fairness=5.0)
    assert not scaled_down(m.handle(RequestArrived(1, "b"), 1.0))
    assert m.next_deadline() == 6.0
    assert scaled_down(m.handle(Tick(), 6.0))  # the swap waited its window: no more hold


def test_llmkube_mode_leaves_the_delay_to_llmkubes_reconciler() -> None:
    m = machine(delay=60.0, actuation=Actuation.LLMKUBE)
    assert Trigger("b") in m.handle(RequestArrived(1, "b"), 1.0)
