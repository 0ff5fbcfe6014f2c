"""PoolMachine under random traffic, clocks, delays and faults (hypothesis).

Each example builds a random pool, cluster and traffic, drives it with the invariant-checking
Driver (harness.py asserts invariants 1-4 and 6 and the view/version rule after every event),
then lets time run with no more traffic and checks that the pool comes to rest. The fault-free
variant also checks the fairness bound on how long a held request can wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_model import FAILS, LOADS, STUCK, Cluster, IdleGate
from harness import Driver, limits, settle, spec

HORIZON = 400.0  # traffic and faults happen in [0, HORIZON)
PROBE_DELAY = 0.1
EXAMPLES = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

times = st.floats(0, HORIZON, allow_nan=False)


@dataclass
class Scenario:
    """Everything one example draws; printed by hypothesis when an example fails."""

    driver: Driver
    max_duration: float
    faults: list[tuple[float, str, str, float | None]]


def _fault(d: Driver, kind: str, member: str, recreate_after: float | None) -> None:
    now = d.now
    if kind == "kill":
        d.cluster.kill(member, now)
    elif kind == "force_up":
        d.cluster.force_up(member, now)
    else:
        d.cluster.delete(member)
        if recreate_after is not None:
            d.at(now + recreate_after, lambda: d.cluster.recreate(member))


@st.composite
def scenarios(draw: st.DrawFn, faults: bool) -> Scenario:
    """A random pool, cluster, idle gate, traffic and (if ``faults``) faults, started."""
    members = ("a", "b", "c")[:draw(st.integers(2, 3))]
    some_member = st.sampled_from(members)
    pool = spec(members, default=draw(st.sampled_from(("",) + members)),
                swap_budget=draw(st.floats(5, 300)),
                fairness_window=draw(st.sampled_from([0.0, 30.0]) | st.floats(1, 60))
                if faults else draw(st.floats(1, 60)),
                swap_policy=draw(st.sampled_from(("sticky", "reclaim", "reclaim-down", "priority"))),
                reclaim_after=draw(st.floats(1, 100)),
                max_held=draw(st.none() | st.integers(1, 5)) if faults else None,
                min_residency=draw(st.sampled_from([0, 0, 2, 5])))
    outcomes = st.sampled_from([LOADS, LOADS, LOADS, FAILS, STUCK]) if faults \
        else st.just(LOADS)
    cluster = Cluster(members, load_delay=draw(st.floats(0.5, 40)),
                      unload_delay=draw(st.floats(0, 10)),
                      outcome={m: draw(outcomes) for m in members})
    # Without faults every load beats the timeout; with them, timeouts may cut loads short.
    timeout = draw(st.floats(20, 200)) + (0 if faults else cluster.load_delay)
    knobs = limits(swap_timeout=timeout, failure_backoff=draw(st.floats(1, 60)),
                   idle_gate=draw(st.booleans()),
                   drain_linger=draw(st.sampled_from([0.0, 0.5, 3.0])))
    warm = draw(st.lists(some_member, max_size=2 if faults else 1, unique=True))
    for m in warm:
        cluster.warm(m)
    cluster.out_of_band = len(warm) > 1  # started with two members up: not the policy's doing
    gate = IdleGate(delay=PROBE_DELAY)
    if faults:
        answers = st.lists(st.sampled_from([True, False, None]), max_size=4)
        gate.scripts = {m: draw(answers) for m in members}
    hint = st.sampled_from(("",) + members)
    d = Driver(pool, knobs, cluster, gate, resident_hint=draw(hint),
               pending_hint=draw(hint) if faults else "", reuse_rids=draw(st.booleans()),
               watch_latency=draw(st.just(0.0) | st.floats(0, 2)))
    d.start()
    max_duration = draw(st.floats(1, 20))
    requests = st.tuples(times, some_member, st.floats(0.1, max_duration),
                         st.none() | st.floats(0, 100) if faults else st.none(),
                         st.just(math.inf) | st.floats(0, 60) if faults else st.just(math.inf),
                         st.sampled_from(["", "", "IfIdle"]) if faults else st.just(""),
                         st.none() | st.integers(-3, 3))
    for at, member, duration, abandon, max_wait, activation, priority in draw(
            st.lists(requests, max_size=40)):
        d.request(member, at=at, duration=duration,
                  abandon_after=math.inf if abandon is None else abandon, max_wait=max_wait,
                  activation=activation, priority=priority)
    # Busy clients: back-to-back overlapping requests keep a member in flight for a while,
    # which is what the fairness window exists for.
    for member, start, length in draw(st.lists(st.tuples(some_member, times,
                                                         st.floats(0, 200)), max_size=2)):
        gap = draw(st.floats(1, max_duration))
        for k in range(int(length / gap)):
            d.request(member, at=start + k * gap, duration=draw(st.floats(gap, max_duration)))
    kinds = st.sampled_from(["kill", "kill", "delete", "force_up"])
    recreate = st.none() | st.floats(0, 120)
    drawn = draw(st.lists(st.tuples(times, kinds, some_member, recreate),
                          max_size=4 if faults else 0))
    for at, kind, member, after in drawn:
        d.at(at, lambda k=kind, m=member, a=after: _fault(d, k, m, a))
    return Scenario(d, max_duration, drawn)


def run_to_rest(d: Driver) -> None:
    """Run the traffic, then let time pass with none, and check the pool came to rest."""
    settle(d, HORIZON)
    m = d.machine
    if not m.view().missing_members:
        assert m.swap is None, f"swap to {m.swap.target} left in stage {m.swap.stage}"
        # Members put up behind the policy's back are only undone once one of them serves
        # (then it is the resident and the rest are scaled down).
        up = d.cluster.up()
        assert len(up) <= 1 or (d.cluster.out_of_band and not m.resident), \
            f"came to rest with {up} up, resident {m.resident!r}"


@EXAMPLES
@given(scenarios(faults=True))
def test_invariants_hold_under_random_traffic_and_faults(s: Scenario) -> None:
    run_to_rest(s.driver)


@EXAMPLES
@given(scenarios(faults=False))
def test_fairness_bounds_every_wait_without_faults(s: Scenario) -> None:
    d = s.driver
    run_to_rest(d)
    # A swap drains the incumbent for at most the fairness window plus one request (or a
    # drain linger after it), then unloads and loads; idle probes add their round trips.
    per_swap = (d.spec.fairness_window + s.max_duration + d.machine.limits.drain_linger
                + d.cluster.unload_delay
                + d.cluster.load_delay + 2 * PROBE_DELAY + 2 * d.watch_latency)
    starts = {}
    for t, c in d.log:
        if getattr(c, "kind", "") == "SwapStarted":
            starts[c.target] = t
        elif getattr(c, "kind", "") == "SwapCompleted":
            assert t - starts[c.target] <= per_swap, (c, per_swap)
    # Oldest first: a held request waits for the swap under way, then at most one swap per
    # member (its own included).
    bound = (len(d.spec.members) + 1) * per_swap
    for r in d.requests.values():
        if r.held and r.state != "rejected":
            assert r.waited <= bound, (r, bound)
        if r.state == "rejected":
            assert r.reject.code == "swap_budget_exceeded" and r.ended == r.deadline
