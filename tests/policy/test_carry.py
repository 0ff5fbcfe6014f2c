"""Prompt-cache carry-over (extproc/policy/carry.py): save before unload, restore before release.

Both modes, by hand; then random traffic, faults and answers (ok, failed, late, never) under
the invariant-checking Driver, which also asserts that a save or restore is asked only of a
member that is up.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draws import member_names, random_cluster, random_pool, random_requests
from extproc.policy.events import (Admit, CarryAnswered, CarrySlots, Hold, MemberObserved,
                                   Notice, RequestArrived, RequestEnded, Scale,
                                   StatusObserved, Tick, Trigger)
from extproc.policy.machine import PoolMachine
from extproc.policy.model import Actuation, MemberObservation, PoolSpec, PoolStatus
from harness import KEY, Driver, limits, settle

TIMEOUT = 10.0
HORIZON = 300.0


def kinds(out: list, kind: type) -> list:
    return [c for c in out if isinstance(c, kind)]


def notices(out: list, kind: str) -> list[Notice]:
    return [c for c in kinds(out, Notice) if c.kind == kind]


def ready(name: str, carry: bool = True) -> MemberObservation:
    return MemberObservation(name, phase="Ready", replicas=1, pods=1, carry=carry)


def stopped(name: str, carry: bool = True) -> MemberObservation:
    return MemberObservation(name, phase="Stopped", carry=carry)


def pool(actuation: Actuation = Actuation.OWN, budget: float = 300.0) -> PoolMachine:
    """Pool a, b, both carrying their prompt cache; a Ready and resident, b Stopped."""
    m = PoolMachine(PoolSpec(KEY, ("a", "b"), fairness_window=0, swap_budget=budget),
                    limits(carry_timeout=TIMEOUT), 0.0, actuation=actuation)
    m.handle(MemberObserved(ready("a")), 0.0)
    m.handle(MemberObserved(stopped("b")), 0.0)
    if actuation is Actuation.LLMKUBE:
        m.handle(StatusObserved(PoolStatus(resident="a", llmkube=True)), 0.0)
    assert m.resident == "a"
    return m


def swap_to(m: PoolMachine, target: str, rid: int, at: float) -> list:
    """own mode, the resident -> ``target`` with its save answered: the commands once
    ``target`` shows Ready."""
    incumbent = m.resident
    out = m.handle(RequestArrived(rid, target), at)
    assert kinds(out, CarrySlots) == [CarrySlots(incumbent, "save")]
    out = m.handle(CarryAnswered(incumbent, "save", True, "1 slot, 200 tokens"), at + 1)
    assert kinds(out, Scale) == [Scale(incumbent, 0)] and notices(out, "PromptCacheCarried")
    m.handle(MemberObserved(stopped(incumbent)), at + 2)
    assert m.swap is not None and m.swap.stage.value == "Loading"
    return m.handle(MemberObserved(ready(target)), at + 3)


def a_to_b_and_back(m: PoolMachine) -> list:
    """a -> b (b never saved: released at once), b -> a: the commands once a is Ready."""
    assert [c.rid for c in kinds(swap_to(m, "b", 1, 1.0), Admit)] == [1]
    m.handle(RequestEnded(1), 5.0)
    return swap_to(m, "a", 2, 6.0)


def test_own_mode_saves_before_unload_and_restores_before_release() -> None:
    m = pool()
    out = a_to_b_and_back(m)
    assert kinds(out, CarrySlots) == [CarrySlots("a", "restore")] and not kinds(out, Admit)
    # while a restores it serves nothing: a newcomer waits with the held one
    assert kinds(m.handle(RequestArrived(3, "a"), 9.5), Hold)
    out = m.handle(CarryAnswered("a", "restore", True, "1 slot, 200 tokens"), 10.0)
    assert [c.rid for c in kinds(out, Admit)] == [2, 3] and m.resident == "a"
    assert notices(out, "PromptCacheCarried")


def test_a_request_for_the_incumbent_while_it_saves_is_held_not_admitted() -> None:
    m = pool()
    m.handle(RequestArrived(1, "b"), 1.0)
    out = m.handle(RequestArrived(2, "a"), 1.5)
    assert kinds(out, Hold) and not kinds(out, Admit)  # no request lands on it before Scale(0)
    assert kinds(m.handle(CarryAnswered("a", "save", True), 2.0), Scale) == [Scale("a", 0)]


def test_an_unanswered_save_is_given_up_at_the_timeout() -> None:
    m = pool()
    m.handle(RequestArrived(1, "b"), 1.0)
    assert m.next_deadline() == 1.0 + TIMEOUT
    out = m.handle(Tick(), 1.0 + TIMEOUT)
    assert kinds(out, Scale) == [Scale("a", 0)]
    failed = notices(out, "PromptCacheCarryFailed")
    assert failed and "no answer within 10s" in failed[0].message
    # the answer that comes later changes nothing
    assert m.handle(CarryAnswered("a", "save", True), 12.0) == []


def test_a_failed_restore_still_releases_at_once() -> None:
    m = pool()
    a_to_b_and_back(m)
    out = m.handle(CarryAnswered("a", "restore", False, "restored 0 tokens"), 10.0)
    assert [c.rid for c in kinds(out, Admit)] == [2]
    assert "restored 0 tokens" in notices(out, "PromptCacheCarryFailed")[0].message


def test_no_step_when_the_budget_has_no_room_for_it() -> None:
    m = pool(budget=15.0)  # a save needs 2 x 10 s plus the expected swap
    out = m.handle(RequestArrived(1, "b"), 1.0)
    assert not kinds(out, CarrySlots) and kinds(out, Scale) == [Scale("a", 0)]
    assert "skipped" in notices(out, "PromptCacheCarryFailed")[0].message


def test_members_without_the_annotation_carry_nothing() -> None:
    m = pool()
    m.handle(MemberObserved(ready("a", carry=False)), 0.5)
    assert kinds(m.handle(RequestArrived(1, "b"), 1.0), Scale) == [Scale("a", 0)]


def llmkube_swap(m: PoolMachine, incumbent: str, target: str, rid: int, at: float) -> list:
    """llmkube mode, ``incumbent`` -> ``target`` as LLMKube's reconciler carries it out, the
    save answered: the commands once the status names ``target`` resident."""
    out = m.handle(RequestArrived(rid, target), at)
    assert kinds(out, CarrySlots) == [CarrySlots(incumbent, "save")] and not kinds(out, Trigger)
    out = m.handle(CarryAnswered(incumbent, "save", True), at + 1)
    assert kinds(out, Trigger) == [Trigger(target)]
    m.handle(MemberObserved(MemberObservation(target, phase="Creating", replicas=1,
                                              carry=True)), at + 2)
    m.handle(StatusObserved(PoolStatus(pending=target, llmkube=True)), at + 2)
    m.handle(MemberObserved(stopped(incumbent)), at + 3)
    m.handle(MemberObserved(ready(target)), at + 4)
    return m.handle(StatusObserved(PoolStatus(resident=target, llmkube=True)), at + 5)


def test_llmkube_mode_saves_before_the_trigger_and_restores_once_resident() -> None:
    m = pool(Actuation.LLMKUBE)
    assert [c.rid for c in kinds(llmkube_swap(m, "a", "b", 1, 1.0), Admit)] == [1]
    m.handle(RequestEnded(1), 7.0)
    out = llmkube_swap(m, "b", "a", 2, 8.0)
    assert kinds(out, CarrySlots) == [CarrySlots("a", "restore")] and not kinds(out, Admit)
    assert kinds(m.handle(RequestArrived(3, "a"), 13.5), Hold)  # resident, not serving yet
    out = m.handle(CarryAnswered("a", "restore", True), 14.0)
    assert [c.rid for c in kinds(out, Admit)] == [2, 3]


@st.composite
def carrying_drivers(draw: st.DrawFn) -> Driver:
    """Random pools whose members carry their cache, with random answers and faults."""
    members = member_names(draw)
    some = st.sampled_from(members)
    pool_spec = random_pool(draw, members, max_budget=300)
    carry = frozenset(members) if draw(st.booleans()) \
        else frozenset(draw(st.lists(some, unique=True)))
    cluster = random_cluster(draw, members, max_capacity=3, carry=carry)
    knobs = limits(carry_timeout=draw(st.floats(0.5, 10)), swap_timeout=60.0,
                   paced_release=draw(st.booleans()), idle_gate=draw(st.booleans()),
                   drain_linger=draw(st.sampled_from([0.0, 0.5])))
    d = Driver(pool_spec, knobs, cluster, carry_delay=draw(st.floats(0, 15)),
               carry_ok=draw(st.sampled_from([True, True, False, None])))
    d.start()
    random_requests(draw, d, HORIZON, min_size=2, max_size=40)
    for at, member in draw(st.lists(st.tuples(st.floats(0, HORIZON), some), max_size=2)):
        d.at(at, lambda m=member: d.cluster.kill(m, d.now))
    return d


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(carrying_drivers())
def test_carry_over_fails_open_and_the_pool_comes_to_rest(d: Driver) -> None:
    settle(d, HORIZON)
    m = d.machine
    assert m.swap is None
    # carry-over adds no refusal of its own: a refused request was refused for its budget
    # or its member's failed load, as without carry-over
    codes = {r.reject.code for r in d.requests.values() if r.reject is not None}
    assert codes <= {"swap_budget_exceeded", "member_failed"}, codes
    asked = d.commands(CarrySlots)
    saves = [c for c in asked if c.step == "save"]
    assert all(d.cluster.members[c.member].carry for c in asked)
    # every save preceded its member's Scale(0) in the same swap: none is asked after it
    for i, (t, command) in enumerate(d.log):
        if isinstance(command, CarrySlots) and command.step == "save":
            later = [c for _, c in d.log[i:] if isinstance(c, Scale) and c.member == command.member]
            assert later, f"save of {command.member} at {t} not followed by its Scale(0)"
    assert not saves or any(c.step == "save" for c in asked)
