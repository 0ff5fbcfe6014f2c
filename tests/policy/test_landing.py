"""Our writes that may still land (policy/landing.py): a wish the runtime dropped unsent is
settled at once, one that may be on the wire lands within the bound, a trigger is untouched.

The machine-level tests replay the fresh-clone failure of the hands-off soak test: a swap's
scale-up wish, dropped with the scaler when the pool went hands-off, made the first swap after
the spell wait the whole write-landing bound (60 s) for a write that was never sent."""

from __future__ import annotations

from dataclasses import replace

from extproc.policy.events import (ActuationChanged, MemberObserved, RequestArrived, Scale,
                                   SpecChanged, Tick, WishesDropped)
from extproc.policy.landing import Landing
from extproc.policy.model import Actuation, MemberObservation
from harness import two_members

BOUND = 60.0


def test_a_scale_up_dropped_before_it_was_sent_is_settled_at_once() -> None:
    landing = Landing()
    landing.asked("b", 1, 0.0, BOUND)
    landing.dropped({}, 1.0, BOUND)
    assert not landing.may_land("b", 1.0) and landing.deadlines(1.0) == []


def test_a_scale_up_that_may_have_been_sent_lands_within_the_bound_from_the_drop() -> None:
    landing = Landing()
    landing.asked("b", 1, 0.0, BOUND)
    landing.dropped({"b": 1}, 1.0, BOUND)
    assert not landing.standing("b")  # the runtime no longer pushes it
    assert landing.may_land("b", 1.0 + BOUND - 0.1) and not landing.may_land("b", 1.0 + BOUND)


def test_only_asks_since_the_entry_opened_count_as_reaching_it() -> None:
    landing = Landing()
    landing.asked("b", 1, 0.0, BOUND)  # ask 1, sent
    landing.seen(MemberObservation("b", phase="Ready", replicas=1, pods=1), 1.0)
    landing.asked("b", 0, 2.0, BOUND)  # ask 2
    landing.asked("b", 1, 3.0, BOUND)  # ask 3 opens a new entry
    landing.dropped({"b": 1}, 4.0, BOUND)  # ask 1 reached the API, not ask 3
    assert not landing.may_land("b", 4.0)
    landing.asked("b", 1, 5.0, BOUND)  # ask 4
    landing.dropped({"b": 4}, 6.0, BOUND)
    assert landing.may_land("b", 6.0 + BOUND - 0.1)


def test_a_withdrawn_wish_reopened_keeps_the_asks_of_its_first_opening() -> None:
    landing = Landing()
    landing.asked("b", 1, 0.0, BOUND)  # ask 1 (may be on the wire)
    landing.asked("b", 0, 1.0, BOUND)  # ask 2 withdraws it: the entry stays open
    landing.asked("b", 1, 2.0, BOUND)  # ask 3: the same entry, opened by ask 1
    landing.dropped({"b": 1}, 3.0, BOUND)
    assert landing.may_land("b", 3.0 + BOUND - 0.1)


def test_a_trigger_is_not_the_scalers_and_keeps_its_bound() -> None:
    landing = Landing()
    landing.asked("b", 1, 0.0, BOUND, standing=False)
    landing.dropped({}, 1.0, BOUND)
    assert landing.may_land("b", BOUND - 0.1) and not landing.may_land("b", BOUND)


def _swap_to_b_then_hands_off(reached: tuple[tuple[str, int], ...]):
    """Own mode, a resident and idle: a request for b unloads a, asks b up, then the pool goes
    hands-off and the runtime drops the wish (``reached``: what it says may have been sent)."""
    m = two_members()
    m.handle(RequestArrived(1, "b"), 1.0)
    out = m.handle(MemberObserved(MemberObservation("a", phase="Stopped")), 2.0)
    assert Scale("b", 1) in out
    m.handle(ActuationChanged(Actuation.HANDS_OFF, "a test's fight"), 3.0)
    m.handle(WishesDropped(reached), 3.0)
    m.handle(SpecChanged(replace(m.spec, resume="now")), 4.0)  # the operator resumes the pool
    assert m.actuation is Actuation.OWN
    return m


def test_after_a_spell_a_wish_dropped_unsent_does_not_hold_the_next_swap() -> None:
    m = _swap_to_b_then_hands_off(())
    out = m.handle(RequestArrived(2, "a"), 4.1)  # b never came up: a loads at once
    assert Scale("a", 1) in out and Scale("b", 0) not in out  # no 60 s wait for a ghost


def test_after_a_spell_a_wish_that_may_be_on_the_wire_is_waited_for_not_withdrawn() -> None:
    m = _swap_to_b_then_hands_off((("b", 1),))
    out = m.handle(RequestArrived(2, "a"), 4.1)
    assert not [c for c in out if isinstance(c, Scale)]  # b may still come up: wait for it
    assert m.next_deadline() == 3.0 + m.limits.write_landing  # from the drop, not from now
    assert Scale("a", 1) in m.handle(Tick(), 3.0 + m.limits.write_landing)
