"""Drive a PoolMachine against the cluster model in model time, checking invariants at each step.

The driver is the policy's runtime in miniature: it feeds events to ``PoolMachine.handle`` in
time order, carries the returned commands out against ``Cluster`` and ``IdleGate``, and
advances time to the earliest of the next cluster change, ``next_deadline()`` and the next
scheduled traffic or fault. After every ``handle`` it asserts the machine's invariants against
the model's ground truth, so any test that drives it is also an invariant test.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Callable

from cluster_model import Cluster, IdleGate
from extproc.policy.events import (Admit, CarryAnswered, CarrySlots, Command, Divert, Event,
                                   Hold, IdleProbed, MemberObserved, Notice, ProbeIdle, Reject,
                                   RequestArrived, RequestEnded, Scale, StatusObserved, Tick)
from extproc.policy import pacing
from extproc.policy.machine import Limits, PoolMachine
from extproc.policy.model import (Actuation, MemberObservation, PoolKey, PoolSpec, PoolStatus,
                                  StartHints)
from extproc.runtime.hub import limits_from
from extproc.settings import Settings

KEY = PoolKey("ns", "pool")
# Ticks at one instant before the driver decides next_deadline() is stuck in the past.
MAX_TICKS_AT_ONE_TIME = 5
# Steps of one run() before the driver decides the machine and the cluster livelock.
MAX_STEPS = 100_000


def limits(**overrides) -> Limits:
    """The service's default Limits (from Settings) with ``overrides``.

    The drain linger starts at 0 here, not at the service's 0.5 s: most policy tests are about
    other rules, and the tests of the linger set it themselves.
    """
    return replace(limits_from(Settings(drain_linger=0.0)), **overrides)


def two_members(actuation: Actuation = Actuation.OWN, **limit_overrides: object) -> PoolMachine:
    """Pool a, b driven by hand: a Ready and named resident by the status, b Stopped; no
    drain linger, no fairness window."""
    m = PoolMachine(PoolSpec(KEY, ("a", "b"), fairness_window=0), limits(**limit_overrides),
                    0.0, actuation=actuation)
    m.handle(MemberObserved(MemberObservation("a", phase="Ready", replicas=1, pods=1)), 0.0)
    m.handle(StatusObserved(PoolStatus(resident="a")), 0.0)
    m.handle(MemberObserved(MemberObservation("b", phase="Stopped")), 0.0)
    return m


def spec(members: tuple[str, ...] = ("a", "b"), **kwargs) -> PoolSpec:
    """A PoolSpec for the test pool."""
    return PoolSpec(KEY, members, **kwargs)


@dataclass(slots=True)
class Request:
    """One client request as the driver saw it."""

    rid: int  # the test's handle for it; unique for the whole run
    member: str
    arrived: float
    duration: float
    abandon_at: float = math.inf
    max_wait: float = math.inf  # the client's own deadline (x-modelpool-max-wait)
    activation: str = ""  # Wait | IfIdle (x-modelpool-activation); "": the pool's
    priority: int | None = None  # x-modelpool-priority (None: the pool's mapping, 0)
    objective: str = ""  # x-gateway-inference-objective
    state: str = "new"  # new | held | admitted | rejected | diverted | abandoned | done
    deadline: float = math.inf
    held: bool = False
    coalesced: bool = False
    behind: str = ""  # target of the swap under way when it was held ("" if none)
    ended: float = math.inf  # when it left the held state or was answered
    reject: Reject | None = None
    wire: int = 0  # the id the machine sees; reused after the request ends if reuse_rids
    # len(Driver.log) when its stream's end reached the machine: events at one model time
    # reach it in some order, and only this says whether an end came before a command
    closed_at_log: int = -1

    @property
    def waited(self) -> float:
        """Seconds between arrival and its answer (admission or rejection)."""
        return self.ended - self.arrived


@dataclass(slots=True)
class Driver:
    """Runs one pool: the machine, the cluster model, traffic and faults, in model time."""

    spec: PoolSpec
    limits: Limits = field(default_factory=limits)
    cluster: Cluster | None = None
    gate: IdleGate = field(default_factory=IdleGate)
    now: float = 0.0
    resident_hint: str = ""
    pending_hint: str = ""
    reuse_rids: bool = False  # hand the machine the smallest free id, as a runtime may
    watch_latency: float = 0.0  # the watch reports each cluster change this much later
    # the slot saves and restores (carry.py): answered this much later, ok or not (None: never)
    carry_delay: float = 0.0
    carry_ok: bool | None = True
    machine: PoolMachine = field(init=False)
    requests: dict[int, Request] = field(default_factory=dict)
    log: list[tuple[float, Command]] = field(default_factory=list)
    _queue: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)
    _rids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _live: dict[int, int] = field(default_factory=dict)  # wire id -> rid, while it lives
    _last_tick: float = -math.inf

    def __post_init__(self) -> None:
        if self.cluster is None:
            self.cluster = Cluster(self.spec.members)
        self.machine = PoolMachine(self.spec, self.limits, self.now,
                                   StartHints(self.resident_hint, self.pending_hint))

    # ---- scheduling ---------------------------------------------------------------------

    def start(self) -> None:
        """Deliver the watch's initial list of every member."""
        for obs in self.cluster.observations():
            self.feed(MemberObserved(obs))

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` at model time ``when``."""
        heapq.heappush(self._queue, (when, next(self._seq), action))

    def request(self, member: str, at: float | None = None, duration: float = 2.0,
                abandon_after: float = math.inf, max_wait: float = math.inf,
                activation: str = "", priority: int | None = None, objective: str = "") -> int:
        """Schedule a request for ``member``; returns its rid."""
        when = self.now if at is None else at
        rid = next(self._rids)
        req = Request(rid, member, when, duration, when + abandon_after, max_wait, activation,
                      priority, objective)
        self.requests[rid] = req
        self.at(when, lambda: self._arrive(req))
        if abandon_after != math.inf:
            self.at(req.abandon_at, lambda: self._abandon(req))
        return rid

    def run(self, until: float = math.inf) -> None:
        """Process everything due up to ``until`` (all of it when inf), in time order."""
        ticks_here = 0
        for _ in range(MAX_STEPS):
            cluster_t = self.cluster.next_time()
            queue_t = self._queue[0][0] if self._queue else math.inf
            deadline = self.machine.next_deadline()
            t = min(cluster_t, queue_t, deadline)
            if t == math.inf or t > until:
                break
            self.now = max(self.now, t)
            if cluster_t <= t:
                self.cluster.advance(self.now)
                self._deliver()
            elif queue_t <= t:
                heapq.heappop(self._queue)[2]()
                self._deliver()  # faults change the cluster directly
            else:
                # A due deadline must be consumed by its Tick, or a runtime would spin.
                ticks_here = ticks_here + 1 if deadline <= self._last_tick else 0
                assert ticks_here < MAX_TICKS_AT_ONE_TIME, \
                    f"next_deadline() {deadline} stays at or before now {self.now}"
                self._last_tick = self.now
                self.feed(Tick())
        else:
            raise AssertionError(f"still busy after {MAX_STEPS} steps at {self.now}: livelock")
        if until != math.inf:
            self.now = max(self.now, until)
            self.feed(Tick())

    # ---- feeding and executing ----------------------------------------------------------

    def feed(self, event: Event) -> list[Command]:
        """Hand one event to the machine now, execute its commands, deliver what they cause."""
        out = self._handle(event)
        self._deliver()
        return out

    def _deliver(self) -> None:
        while changes := self.cluster.take_changes():
            for obs in changes:
                if self.watch_latency:
                    self.at(self.now + self.watch_latency, lambda o=obs: self._observe(o))
                else:
                    self._observe(obs)

    def _observe(self, obs: MemberObservation) -> None:
        if obs.name in self.machine.spec.members:  # the watch follows the spec
            self._handle(MemberObserved(obs))

    def _handle(self, event: Event) -> list[Command]:
        if isinstance(event, RequestEnded):
            self._ended(self._req(event.rid))
        out = self.machine.handle(event, self.now)
        for command in out:
            self.log.append((self.now, command))
            self._execute(command)
        self._check_state()
        if any(isinstance(c, Scale) for c in out):
            # Invariant 6: a Degraded pool makes no replica changes.
            assert not self.machine.view().missing_members, f"Scale while Degraded: {out}"
        return out

    def _execute(self, command: Command) -> None:
        match command:
            case Admit(wire, member, held_for):
                req = self._req(wire)
                # Invariant 3: only the resident, Ready member is admitted to.
                assert member == req.member and req.state in ("new", "held"), (command, req)
                assert self.machine.resident == member and self.machine.obs[member].ready, \
                    f"admit to {member} while resident is {self.machine.resident!r}"
                # With a lagging watch the pod may have died since; the machine cannot know.
                assert self.watch_latency or self.cluster.ready(member), \
                    f"admit to {member} which is not Ready"
                assert held_for == (self.now - req.arrived if req.held else 0.0)
                req.state, req.ended = "admitted", self.now
                if req.duration != math.inf:
                    self.at(self.now + req.duration, lambda: self.feed(RequestEnded(wire)))
            case Hold(wire, member, deadline, coalesced):
                req = self._req(wire)
                assert req.state == "new" and member == req.member, (command, req)
                assert deadline == req.arrived + self.machine.spec.swap_budget
                req.state, req.held, req.deadline, req.coalesced = "held", True, deadline, \
                    coalesced
                swap = self.machine.swap
                req.behind = swap.target if swap else ""
            case Reject(wire):
                req = self._req(wire)
                assert req.state in ("new", "held"), (command, req)
                assert command.retry_after >= 0 if command.status == 404 \
                    else command.retry_after >= 1
                req.state, req.ended, req.reject = "rejected", self.now, command
                del self._live[wire]
            case Divert(wire, member, to):
                req = self._req(wire)
                assert req.state == "new" and member == req.member, (command, req)
                assert to == self.machine.spec.fallbacks[member], command
                req.state, req.ended = "diverted", self.now
                del self._live[wire]
            case Scale(member, replicas):
                self._check_scale(member, replicas)
                self.cluster.scale(member, replicas, self.now)
            case ProbeIdle(member):
                answer = self.gate.answer(member)
                self.at(self.now + self.gate.delay,
                        lambda: self.feed(IdleProbed(member, answer)))
            case CarrySlots(member, step):
                # the member's runtime must still be up: saved before its Scale(0), restored
                # once Ready
                assert self.machine.obs[member].ready, (command, self.machine.obs[member])
                if self.carry_ok is not None:
                    answer = CarryAnswered(member, step, self.carry_ok, "by the test")
                    self.at(self.now + self.carry_delay, lambda: self.feed(answer))
            case Notice():
                pass

    def _check_scale(self, member: str, replicas: int) -> None:
        if replicas > 0 and not self.cluster.out_of_band:
            # Invariant 1: scale up only once every other member holds no GPU memory.
            others = [m for m in self.cluster.up() if m != member]
            assert not others, f"Scale({member}, 1) while {others} still hold the GPU"
        if replicas == 0:
            # Invariant 2: drain before unload.
            busy = [r.wire for r in self.requests.values()
                    if r.member == member and r.state == "admitted"]
            assert not busy, f"Scale({member}, 0) with requests {busy} in flight"

    def _check_state(self) -> None:
        if not self.cluster.out_of_band:
            assert len(self.cluster.up()) <= 1, f"two members up: {self.cluster.up()}"
        held = {r.wire for r in self.requests.values() if r.state == "held"}
        admitted = {r.wire for r in self.requests.values() if r.state == "admitted"}
        assert held == set(self.machine.held), (held, set(self.machine.held))
        in_flight = set(self.machine.requests.in_flight)
        assert admitted == in_flight, (admitted, in_flight)
        # Invariant 4: nothing stays held past its deadline (the budget).
        late = [r.wire for r in self.requests.values() if r.state == "held"
                and r.deadline <= self.now]
        assert not late, f"requests {late} still held at {self.now}, past their deadline"
        # Paced release: never more in flight than a member takes, and never a held request
        # left waiting while its serving member has room for it (work-conserving).
        m = self.machine
        for name in m.spec.members:
            cap = pacing.capacity(m, name)
            assert not cap or m.requests.busy(name) <= cap, \
                f"{m.requests.busy(name)} in flight on {name}, capacity {cap}"
        assert not pacing.room_freed(m, self.now), f"held with room free: {m.held}"

    def _req(self, wire: int) -> Request:
        return self.requests[self._live[wire]]

    def _arrive(self, req: Request) -> None:
        wire = req.rid
        if self.reuse_rids:
            wire = next(i for i in itertools.count(1) if i not in self._live)
        req.wire = wire
        self._live[wire] = req.rid
        self.feed(RequestArrived(wire, req.member, req.max_wait, req.activation,
                                 req.objective, req.priority))

    def _ended(self, req: Request) -> None:
        req.closed_at_log = len(self.log)
        if req.state == "admitted":
            req.state = "done"
        elif req.state == "held":
            req.state, req.ended = "abandoned", self.now
        del self._live[req.wire]

    def _abandon(self, req: Request) -> None:
        if req.state == "held":
            self.feed(RequestEnded(req.wire))

    # ---- reading the record -------------------------------------------------------------

    def commands(self, kind: type) -> list[Command]:
        """Every command of one type issued so far, in order."""
        return [c for _, c in self.log if isinstance(c, kind)]

    def notices(self, kind: str) -> list[Notice]:
        """Every Notice of one kind issued so far."""
        return [c for c in self.commands(Notice) if c.kind == kind]


def settle(d: Driver, horizon: float) -> None:
    """Run the traffic up to ``horizon``, then on with none: every request has ended, nothing
    is held or in flight, and no deadline is left (the pool came to rest)."""
    d.run(until=horizon)
    d.run()
    m = d.machine
    assert {r.state for r in d.requests.values()} <= {"done", "rejected", "abandoned"}
    assert not m.held and not m.requests.in_flight and m.next_deadline() == math.inf
