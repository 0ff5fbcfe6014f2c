"""Actuation modes in the pure policy: llmkube mode (the activator beside LLMKube's reconciler),
own mode's intruder and fight rules, and auto mode's choice. The machine is driven by hand,
event by event, so each rule is seen in the commands it produces."""

from __future__ import annotations

from extproc.policy.events import (
    Admit,
    Hold,
    MemberObserved,
    Notice,
    Reject,
    RequestArrived,
    RequestEnded,
    Scale,
    StatusObserved,
    Tick,
    Trigger,
)
from extproc.policy.machine import PoolMachine
from extproc.policy.model import Actuation, PoolKey, PoolSpec, PoolStatus
from extproc.policy.model import MemberObservation as Obs
from harness import limits

KEY = PoolKey("ns", "pool")
READY = dict(phase="Ready", replicas=1, pods=1)
STOPPED = dict(phase="Stopped", replicas=0, pods=0)


def machine(actuation: Actuation = Actuation.OWN, *, auto: bool = False,
            status: PoolStatus | None = None) -> PoolMachine:
    """A pool a, b with a Ready (and, in llmkube mode, resident per the status) and b Stopped."""
    m = PoolMachine(PoolSpec(KEY, ("a", "b"), fairness_window=0), limits(), 0.0,
                    actuation=actuation, auto=auto)
    if status is not None:
        m.handle(StatusObserved(status), 0.0)
    m.handle(MemberObserved(Obs("a", **READY)), 0.0)
    m.handle(MemberObserved(Obs("b", **STOPPED)), 0.0)
    return m


def kinds(commands: list, kind: type) -> list:
    return [c for c in commands if isinstance(c, kind)]


def test_llmkube_mode_triggers_once_our_requests_on_the_incumbent_end() -> None:
    m = machine(Actuation.LLMKUBE, status=PoolStatus(resident="a"))
    assert kinds(m.handle(RequestArrived(1, "a"), 1.0), Admit)  # resident: admitted
    out = m.handle(RequestArrived(2, "b"), 2.0)
    assert kinds(out, Hold) and not kinds(out, Trigger)  # request 1 still streams on a
    out = m.handle(RequestEnded(1), 3.0)
    assert kinds(out, Trigger) == [Trigger("b")] and not kinds(out, Scale)


def test_llmkube_mode_releases_only_when_the_status_names_the_target() -> None:
    m = machine(Actuation.LLMKUBE, status=PoolStatus(resident="a"))
    m.handle(RequestArrived(1, "b"), 1.0)
    # LLMKube unloads a and loads b; b is Ready before the status says so: still held
    m.handle(MemberObserved(Obs("a", **STOPPED)), 2.0)
    assert not kinds(m.handle(MemberObserved(Obs("b", **READY)), 3.0), Admit)
    out = m.handle(StatusObserved(PoolStatus(resident="b")), 3.1)
    assert kinds(out, Admit) == [Admit(1, "b", 3.1 - 1.0, "a->b")]
    assert [n.kind for n in kinds(out, Notice)] == ["SwapCompleted"]


def test_llmkube_mode_holds_the_incumbent_once_a_swap_is_under_way() -> None:
    m = machine(Actuation.LLMKUBE, status=PoolStatus(resident="a"))
    m.handle(RequestArrived(1, "b"), 1.0)  # triggered at once: nothing of ours on a
    # a is still Ready (LLMKube's probe may be slow): a new request for it must not pass
    out = m.handle(RequestArrived(2, "a"), 1.5)
    assert kinds(out, Hold) and not kinds(out, Admit)


def test_llmkube_mode_follows_a_swap_someone_else_started() -> None:
    m = machine(Actuation.LLMKUBE, status=PoolStatus(resident="a"))
    out = m.handle(StatusObserved(PoolStatus(resident="a", pending="b")), 1.0)
    assert [n.kind for n in kinds(out, Notice)] == ["SwapStarted"]
    assert kinds(m.handle(RequestArrived(1, "a"), 1.5), Hold)  # a is on its way out
    m.handle(MemberObserved(Obs("a", **STOPPED)), 2.0)
    m.handle(MemberObserved(Obs("b", **READY)), 3.0)
    m.handle(StatusObserved(PoolStatus(resident="b")), 3.0)
    # then a is wanted back: our own trigger, never a scale-down
    out = m.handle(Tick(), 3.1)
    assert not kinds(out, Scale)


def test_llmkube_mode_reports_the_reconcilers_deferral() -> None:
    m = machine(Actuation.LLMKUBE, status=PoolStatus(resident="a"))
    m.handle(RequestArrived(1, "b"), 1.0)
    out = m.handle(StatusObserved(PoolStatus(resident="a", pending="b",
                                             deferred_reason="PodsBusy")), 2.0)
    [deferred] = [n for n in kinds(out, Notice) if n.kind == "SwapDeferred"]
    assert deferred.source == "PodsBusy"
    assert m.view().deferred_reason == "PodsBusy"


def test_own_mode_hands_off_when_another_writer_rewrites_the_status() -> None:
    m = machine()
    m.handle(RequestArrived(1, "b"), 1.0)
    out = m.handle(StatusObserved(PoolStatus(resident="a", foreign=True)), 1.1)
    [changed] = [n for n in kinds(out, Notice) if n.kind == "ActuationChanged"]
    assert changed.target == "hands-off"
    assert [(r.rid, r.code) for r in kinds(out, Reject)] == [(1, "pool_conflict")]
    assert kinds(m.handle(RequestArrived(2, "a"), 2.0), Admit)  # routing goes on
    refused = kinds(m.handle(RequestArrived(3, "b"), 2.1), Reject)
    assert [r.code for r in refused] == ["pool_conflict"]
    assert not kinds(m.handle(Tick(), 5.0), Scale)


def test_auto_mode_hands_the_pool_to_llmkube_when_its_conditions_show() -> None:
    m = machine(auto=True, status=PoolStatus(resident="a", llmkube=True))
    assert m.actuation is Actuation.LLMKUBE
    out = m.handle(RequestArrived(1, "b"), 1.0)
    assert kinds(out, Trigger) == [Trigger("b")] and not kinds(out, Scale)


def test_auto_mode_stays_own_and_says_so_without_another_writer() -> None:
    m = PoolMachine(PoolSpec(KEY, ("a", "b")), limits(), 0.0, auto=True)
    out = m.handle(StatusObserved(PoolStatus()), 0.0)
    [said] = [n for n in kinds(out, Notice) if n.kind == "ActuationChanged"]
    assert said.target == "own" and m.actuation is Actuation.OWN
    assert not kinds(m.handle(StatusObserved(PoolStatus(resident="a")), 0.1), Notice)


def test_own_mode_scales_an_intruder_down_while_the_incumbent_drains() -> None:
    m = machine()
    m.handle(RequestArrived(1, "a"), 1.0)  # a busy: the swap waits in Draining
    m.handle(RequestArrived(2, "b"), 1.1)
    out = m.handle(MemberObserved(Obs("b", phase="Creating", replicas=1, pods=1)), 1.5)
    assert kinds(out, Scale) == [Scale("b", 0)]  # b would share the GPU with a: not later


def test_own_mode_calls_it_a_fight_when_a_member_is_scaled_up_again_and_again() -> None:
    m = machine()
    m.handle(RequestArrived(1, "a"), 1.0)
    m.handle(RequestArrived(2, "b"), 1.1)
    now, notices = 1.5, []
    for _ in range(3):  # someone scales b up; we undo it; it comes back
        out = m.handle(MemberObserved(Obs("b", phase="Creating", replicas=1, pods=1)), now)
        m.handle(MemberObserved(Obs("b", **STOPPED)), now + 0.1)
        notices += [n for n in kinds(out, Notice) if n.kind == "ActuationChanged"]
        now += 1.0
    out = m.handle(MemberObserved(Obs("b", phase="Creating", replicas=1, pods=1)), now)
    notices += [n for n in kinds(out, Notice) if n.kind == "ActuationChanged"]
    assert [n.target for n in notices] == ["hands-off"]
    assert m.actuation is Actuation.HANDS_OFF
