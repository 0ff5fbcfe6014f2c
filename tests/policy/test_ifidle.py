"""IfIdle activation (policy/ifidle.py): an IfIdle request never makes a busy incumbent give way.

By example (both actuation modes, driven by hand) and as properties over random traffic
through the invariant-checking Driver: every IfIdle request that arrives while the incumbent
streams, or while the slot moves elsewhere, is answered at its arrival (503
pool_incumbent_busy, or its member's fallback), and no swap to a member only IfIdle requests
ask for starts while the incumbent has a request in flight.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_model import Cluster
from extproc.policy import ifidle
from extproc.policy.events import (Admit, Divert, Hold, MemberObserved, Notice, PeersObserved,
                                   Reject, RequestArrived, RequestEnded, Scale, SpecChanged,
                                   Trigger)
from extproc.policy.machine import PoolMachine
from extproc.policy.model import Actuation, MemberObservation, PeerState, PoolSpec
from harness import KEY, Driver, limits, spec, two_members

FALLBACK = "fallback.b-cloud.ns"


def kinds(commands: list, kind: type) -> list:
    return [c for c in commands if isinstance(c, kind)]


@pytest.mark.parametrize("actuation", [Actuation.OWN, Actuation.LLMKUBE])
def test_if_idle_behind_a_busy_incumbent_is_answered_at_once_and_starts_no_swap(
        actuation: Actuation) -> None:
    m = two_members(actuation)
    assert kinds(m.handle(RequestArrived(1, "a"), 1.0), Admit)
    out = m.handle(RequestArrived(2, "b", activation=ifidle.IF_IDLE), 2.0)
    [reject] = out
    assert isinstance(reject, Reject) and (reject.status, reject.code) == (503, ifidle.BUSY_CODE)
    assert "'a' is serving 1 request(s)" in reject.message and reject.retry_after >= 1
    assert m.swap is None and not m.wishes
    # Once a is idle, the same request is held and the swap starts (Trigger or Scale).
    m.handle(RequestEnded(1), 3.0)
    out = m.handle(RequestArrived(3, "b", activation=ifidle.IF_IDLE), 4.0)
    assert kinds(out, Hold) and m.swap is not None and m.swap.target == "b"
    assert kinds(out, Trigger if actuation is Actuation.LLMKUBE else Scale)


def test_the_pool_annotation_makes_if_idle_the_default_and_wait_overrides_it() -> None:
    m = two_members()
    m.handle(SpecChanged(PoolSpec(KEY, ("a", "b"), fairness_window=0,
                                  activation=ifidle.IF_IDLE)), 0.5)
    m.handle(RequestArrived(1, "a"), 1.0)
    assert kinds(m.handle(RequestArrived(2, "b"), 2.0), Reject)
    out = m.handle(RequestArrived(3, "b", activation=ifidle.WAIT), 3.0)
    assert kinds(out, Hold) and m.swap is not None


def test_a_named_fallback_takes_the_request_instead() -> None:
    m = two_members()
    m.handle(SpecChanged(PoolSpec(KEY, ("a", "b"), fairness_window=0,
                                  fallbacks={"b": FALLBACK})), 0.5)
    m.handle(RequestArrived(1, "a"), 1.0)
    out = m.handle(RequestArrived(2, "b", activation=ifidle.IF_IDLE), 2.0)
    assert out == [Divert(2, "b", FALLBACK, ifidle.BUSY_CODE)]
    assert not m.requests.knows(2) and m.swap is None
    # A diverted request is forgotten: its id may be reused at once.
    assert kinds(m.handle(RequestArrived(2, "a"), 3.0), Admit)


def three_members() -> PoolMachine:
    """Pool a, b, c with a Ready and resident (it served one request), b and c Stopped."""
    m = PoolMachine(PoolSpec(KEY, ("a", "b", "c"), fairness_window=0), limits(), 0.0)
    m.handle(MemberObserved(MemberObservation("a", phase="Ready", replicas=1, pods=1)), 0.0)
    for name in ("b", "c"):
        m.handle(MemberObserved(MemberObservation(name, phase="Stopped")), 0.0)
    m.handle(RequestArrived(99, "a"), 0.0)
    m.handle(RequestEnded(99), 0.0)
    return m


def test_a_swap_to_another_member_counts_as_busy_and_one_to_its_own_is_joined() -> None:
    m = three_members()
    m.handle(RequestArrived(1, "b"), 1.0)  # a is idle: the swap to b starts
    assert m.swap is not None and m.swap.target == "b"
    [reject] = m.handle(RequestArrived(2, "c", activation=ifidle.IF_IDLE), 1.5)
    assert isinstance(reject, Reject) and "already moving to 'b'" in reject.message
    assert kinds(m.handle(RequestArrived(3, "b", activation=ifidle.IF_IDLE), 1.6), Hold)


def test_other_replicas_streams_on_the_incumbent_count() -> None:
    m = two_members()
    m.handle(PeersObserved((PeerState("peer", 0.0, in_flight={"a": 2}),)), 1.0)
    [reject] = m.handle(RequestArrived(1, "b", activation=ifidle.IF_IDLE), 2.0)
    assert isinstance(reject, Reject) and "serving 2 request(s)" in reject.message
    # a lost peer's counts are unknown, not busy: the request is held
    m.handle(PeersObserved((PeerState("peer", 0.0, lost=True, in_flight={"a": 2}),)), 3.0)
    assert kinds(m.handle(RequestArrived(2, "b", activation=ifidle.IF_IDLE), 4.0), Hold)


@pytest.mark.parametrize("text,name", [("IfIdle", "IfIdle"), ("if-idle", "IfIdle"),
                                       ("IFIDLE", "IfIdle"), (" wait ", "Wait")])
def test_parse_accepts_llmkube_and_header_spellings(text: str, name: str) -> None:
    assert ifidle.parse(text) == name


def test_parse_refuses_anything_else_in_one_line() -> None:
    with pytest.raises(ValueError, match="not an activation"):
        ifidle.parse("sometimes")


# ---- properties ---------------------------------------------------------------------------

times = st.floats(0, 300)


@st.composite
def traffic(draw: st.DrawFn) -> tuple[Driver, bool]:
    """A warm resident a with busy clients, and IfIdle requests for b (some pools name b's
    fallback); nothing else asks for b."""
    fallback = draw(st.booleans())
    pool = spec(("a", "b"), default="a", fairness_window=draw(st.sampled_from([0.0, 10.0])),
                fallbacks={"b": FALLBACK} if fallback else {},
                activation=draw(st.sampled_from([ifidle.WAIT, ifidle.IF_IDLE])))
    cluster = Cluster(pool.members, load_delay=draw(st.floats(0.5, 20)),
                      unload_delay=draw(st.floats(0, 5)))
    cluster.warm("a")
    d = Driver(pool, limits(drain_linger=draw(st.sampled_from([0.0, 0.5]))), cluster)
    d.start()
    for at, duration in draw(st.lists(st.tuples(times, st.floats(0.1, 30)), max_size=30)):
        d.request("a", at=at, duration=duration)
    header = st.sampled_from(["", ifidle.IF_IDLE]) if pool.activation == ifidle.IF_IDLE \
        else st.just(ifidle.IF_IDLE)
    for at, duration, activation in draw(st.lists(st.tuples(times, st.floats(0.1, 10), header),
                                                  max_size=15)):
        d.request("b", at=at, duration=duration, activation=activation)
    return d, fallback


def in_flight_at(d: Driver, member: str, t: float) -> bool:
    """Whether a request for ``member`` was streaming at ``t`` (open interval: ties are not)."""
    return any(r.member == member and r.state in ("admitted", "done")
               and r.ended < t < r.ended + r.duration for r in d.requests.values())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traffic())
def test_no_swap_for_if_idle_requests_starts_behind_a_busy_incumbent(
        case: tuple[Driver, bool]) -> None:
    d, fallback = case
    d.run(until=400)
    d.run()
    for t, command in d.log:
        if isinstance(command, Notice) and command.kind == "SwapStarted" \
                and command.target == "b":
            assert not in_flight_at(d, "a", t), f"swap to b started at {t} while a streamed"
    states = {r.state for r in d.requests.values()}
    assert states <= {"done", "rejected", "diverted", "abandoned"}
    for r in d.requests.values():  # b's busy answers are its fallback, when it has one
        if r.member == "b" and fallback:
            assert r.reject is None or r.reject.code != ifidle.BUSY_CODE, r
        assert r.state != "diverted" or (fallback and r.member == "b"), r


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traffic())
def test_every_if_idle_refusal_is_immediate_and_true(case: tuple[Driver, bool]) -> None:
    d, _ = case
    d.run(until=400)
    d.run()
    for r in d.requests.values():
        answered = r.state == "diverted" or (r.reject is not None
                                             and r.reject.code == ifidle.BUSY_CODE)
        if answered:
            assert r.ended == r.arrived and not r.held
            # True when said: the incumbent streamed, or a swap had started
            other = "a" if r.member == "b" else "b"
            swaps = [t for t, c in d.log if isinstance(c, Notice) and c.kind == "SwapStarted"
                     and t <= r.arrived]
            assert in_flight_at(d, other, r.arrived) or _streaming_at_edge(d, other, r.arrived) \
                or swaps, r
    assert math.isinf(d.machine.next_deadline())


def _streaming_at_edge(d: Driver, member: str, t: float) -> bool:
    """A request of ``member`` admitted or ending exactly at ``t`` (ties the open interval
    skips)."""
    return any(r.member == member and r.state in ("admitted", "done")
               and (r.ended == t or r.ended + r.duration == t) for r in d.requests.values())
