"""Exhaustive explicit-state search over the real ``PoolMachine`` (in the manner of TLA+'s TLC).

A state is the machine (copied with ``copy.deepcopy``, compared by a fingerprint of its
fields) plus the environment of ``explore_env.py`` (a frozen value). From each state the search
tries every enabled move of the environment, breadth first, up to a depth, and skips states
it has seen. It checks two things:

* Safety, at every step (``explore_checks.py``, in the environment's own words: Ready and
  unloaded are read from the pods and phase the watch last delivered, never from the machine's
  ``ready`` or ``unloaded``): no scale-up while another member holds the GPU (nor while a
  scale-up of ours to another is in flight), no scale-down of a member with a stream on it, no
  admission to a member not shown Ready (nor, paced, beyond its capacity), no trigger but of a
  member shown at 0, no hold past its budget, no ``PolicyError``, no untrue "the swap
  continues", a stalled swap has said SwapStalled, no request for the incumbent admitted past
  the fairness window of a moving swap, and (paced) no new request passing one held for the
  same member.
* No wedge, at every state, taken as the moment the environment goes quiet (no more faults or
  new clients; the cluster only carries out what it was asked, and time passes): after the
  quiet horizon (``quiet_horizon``, from the limits) every held request has been answered, a
  swap still under way has a deadline (it will be said stalled), and a new request for each
  member is served within its budget, unless something outside the service blocks that
  member (``explore_checks.blocked``, exactly), where it must be refused with the truth (and,
  blocked by a stuck pod, with the swap said stalled); and a new request for a resident the
  cluster shows Ready is always served (unless clients that never end keep a moving swap
  draining).

A violation carries the shortest trace that leads to it, one readable line per move.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, is_dataclass, replace
from enum import Enum

import explore_checks as checks
from explore_faults import clients_and_faults
from explore_env import (LEASE, NAMES, STATUS, TRIGGER, Env, holds_gpu, kubelet_step, land,
                         landable, lead, reconcile)
from extproc.policy.events import (CarryAnswered, DrainAnnounced, Event, IdleProbed,
                                   MemberObserved, RequestArrived, RequestEnded, StatusObserved,
                                   Tick, WishesDropped)
from extproc.policy.model import Actuation
from extproc.policy.machine import PolicyError, PoolMachine
from extproc.policy.model import (PHASE_READY, MemberObservation, PeerState, PoolKey,
                                  PoolSpec, PoolStatus, StartHints)
from extproc.policy.state import Limits as _Limits

MAX_QUIET_STEPS = 2_000
MAX_TICKS_AT_ONE_TIME = 5

# The machine's frozen values are shared between copies, never mutated: copying them is waste
# (three quarters of the search's time before this).
for _frozen in (MemberObservation, PeerState, PoolKey, PoolSpec, PoolStatus, StartHints, _Limits):
    copy._deepcopy_dispatch[_frozen] = lambda value, memo: value  # type: ignore[attr-defined]


class Violation(AssertionError):
    """A broken invariant or a wedge, with the moves that lead to it."""

    def __init__(self, what: str, trace: tuple[str, ...]) -> None:
        self.what, self.trace = what, trace
        lines = "\n".join(f"  {i + 1:2}. {line}" for i, line in enumerate(trace))
        super().__init__(f"{what}\nafter:\n{lines}")


@dataclass(slots=True)
class Node:
    """One state of the search: the machine, its environment, and how it was reached."""

    machine: PoolMachine
    env: Env
    trace: tuple[str, ...] = ()
    answers: dict[int, str] = field(default_factory=dict)  # rid -> "admitted" or the refusal
    said: tuple[str, float] | None = None  # the stalled swap SwapStalled was said for


_HASHABLE = (MemberObservation, PoolKey, PoolStatus, StartHints, _Limits)  # frozen, flat
_FIELDS: dict[type, tuple[str, ...]] = {}
_SHARED: dict[int, object] = {}  # id -> fingerprint of shared frozen values (PoolSpec)



def _drop_wishes(child: Node, now: float) -> None:
    """The runtime cancels its scaler with a hands-off spell and tells the machine which
    wishes may have reached the API (driver._on_notice): a scale-up on the wire, or landed and
    not yet delivered by the watch. A patch on the wire still lands (within the API's request
    timeout, perhaps after an operator resumed the pool); the queued ones die unsent."""
    m, env = child.machine, child.env
    on_wire = {n for n, r, by in env.patches if r != TRIGGER and r > 0 and by < math.inf}
    unseen = {n for n in env.dirty
              if n in NAMES and env.member(n).replicas > env.seen_member(n).replicas}
    asks = m.landing.asks  # (the scaler counts the same asks: landing.py)
    reached = tuple((n, asks[n]) for n in sorted(on_wire | unseen) if n in asks)
    for command in m.handle(WishesDropped(reached), now):
        checks.carry_out(child, command)
    child.env = replace(child.env, patches=tuple(p for p in child.env.patches if p[2] < math.inf))


def _shown(m: PoolMachine) -> tuple:
    """What the driver derives from the machine after an event: the view without its held and
    in-flight counts (gauges), the held counts by member, and the next deadline."""
    return replace(m.view(), held=0, in_flight=0), dict(m.requests.held_by), m.next_deadline()


def fingerprint(value: object) -> object:
    """A hashable value equal for equal states (the request book's lazy heap left out: its
    stale entries change nothing, its live ones follow from the held requests)."""
    if value is None or isinstance(value, (str, int, float, bool, _HASHABLE)):
        return value
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return tuple((k, fingerprint(v)) for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(fingerprint(v) for v in value))
    if isinstance(value, (list, tuple)) or type(value).__name__ == "deque":
        return tuple(fingerprint(v) for v in value)
    if isinstance(value, PoolSpec):  # frozen and shared by every copy: once per object
        if id(value) not in _SHARED:
            _SHARED[id(value)] = (value, tuple(fingerprint(getattr(value, f.name))
                                               for f in fields(value)))
        return _SHARED[id(value)][1]
    kind = type(value)
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = tuple(f.name for f in fields(value)) if is_dataclass(value) \
            else ()
    if names:
        return (kind.__name__, *(fingerprint(getattr(value, n)) for n in names))
    return (kind.__name__, *((k, fingerprint(v)) for k, v in sorted(vars(value).items())
                             if k != "_deadlines"))


def key(node: Node) -> object:
    """What makes two nodes the same state."""
    return fingerprint(node.machine), node.env


@dataclass
class Scenario:
    """A starting state and the bounds of its search."""

    name: str
    root: Node
    depth: int
    quiet_horizon: float


class Search:
    """Breadth-first search of one scenario; ``run`` raises ``Violation`` or returns counts."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.explored = 0
        self.quiet_checked = 0
        self._verdicts: set[object] = set()  # states whose quiet continuation was checked
        self._in_place = False

    # ---- the search ------------------------------------------------------------------------

    def run(self) -> tuple[int, int]:
        """Explore every state up to the depth; (states explored, distinct quiet continuations)."""
        frontier = [self.scenario.root]
        seen = {key(self.scenario.root)}
        for level in range(self.scenario.depth + 1):
            following: list[Node] = []
            for node in frontier:
                self.explored += 1
                self.never_wedged(node)
                if level == self.scenario.depth:
                    continue
                for child in self.children(node):
                    k = key(child)
                    if k not in seen:
                        seen.add(k)
                        following.append(child)
            frontier = following
        return self.explored, self.quiet_checked

    def children(self, node: Node) -> Iterator[Node]:
        """Every state one move away."""
        for label, make in self.moves(node, quiet=False):
            yield make()

    # ---- moves -----------------------------------------------------------------------------

    def moves(self, node: Node, quiet: bool) -> list[tuple[str, Callable[[], Node]]]:
        """The moves enabled in ``node``: progress first (a quiet cluster takes the first),
        then clients and faults (never when ``quiet``), then time."""
        env, m = node.env, node.machine
        out: list[tuple[str, Callable[[], Node]]] = []

        def add(label: str, new_env: Env, *events: Event, at: float | None = None) -> None:
            out.append((label, lambda: self.apply(node, label, new_env, events, at)))

        for name in sorted(env.dirty)[:1] if quiet else sorted(env.dirty):
            rest = replace(env, dirty=env.dirty - {name})
            if name == STATUS:
                add(f"the watch delivers the status {env.pool_status()}", rest,
                    StatusObserved(env.pool_status()))
            elif name == LEASE:
                add(f"the leader Lease shows epoch {env.epoch} for {env.announced!r}", rest,
                    DrainAnnounced(env.epoch, env.announced))
            elif name in m.spec.members or name in m.departing:
                add(f"the watch delivers {env.observe(name)}", rest.delivered(name),
                    MemberObserved(env.observe(name)))
            else:  # (the runtime feeds only what the machine tracks: driver.tracks)
                add(f"the watch delivers {name}, no longer tracked", rest.delivered(name))
        if quiet and out:
            return out  # a quiet cluster takes the first progress move only
        for i in landable(env):
            name, replicas, _ = env.patches[i]
            what = "trigger" if replicas == TRIGGER else f"replicas={replicas}"
            add(f"our patch {name} {what} lands", land(env, i, m.now + m.limits.write_landing))
        if quiet and out:
            return out  # a quiet cluster takes the first progress move only
        if env.probes:
            name = env.probes[0]
            idle = not env.busy(name)
            add(f"the idle probe of {name} says {'idle' if idle else 'busy'}",
                replace(env, probes=env.probes[1:]), IdleProbed(name, idle))
        if quiet and out:
            return out  # a quiet cluster takes the first progress move only
        if env.carries:
            name, step = env.carries[0]
            add(f"the slot {step} of {name} is done", replace(env, carries=env.carries[1:]),
                CarryAnswered(name, step, True))
        if quiet and out:
            return out  # a quiet cluster takes the first progress move only
        for name in NAMES:
            stepped = kubelet_step(env, name)
            if stepped is not None:
                add(f"{name}'s pods move: {stepped.member(name)}", stepped)
        if quiet and out:
            return out  # a quiet cluster takes the first progress move only
        if env.llmkube:
            passed = reconcile(env, m.spec.default, m.spec.members)
            if passed is not None:
                add(f"LLMKube's reconciler passes: status {passed.status}, "
                    f"replicas {[x.replicas for x in passed.members]}", passed)
        if env.follow:
            acked = m.drain[0] if m.actuation is Actuation.FOLLOW else 0
            led = lead(env, dict(m.requests.held_by), acked)
            if led is not None:
                add(f"the leading replica acts: epoch {led.epoch} for {led.announced!r}, "
                    f"status {led.status}, replicas {[x.replicas for x in led.members]}", led)
        if quiet and out:
            return out  # a quiet cluster takes the first progress move only
        for rid, name in () if quiet and env.endless else env.admitted:
            add(f"request {rid} on {name} ends", replace(
                env, admitted=tuple(a for a in env.admitted if a[0] != rid)), RequestEnded(rid))
        if quiet and out:
            return out  # a quiet cluster takes the first progress move only
        if not quiet:
            clients_and_faults(node, add)
        deadline = m.next_deadline()
        # (a patch sent lands or fails within the API's request timeout: time waits for it)
        if deadline < min((by for _, _, by in env.patches), default=float("inf")):
            out.append((f"time passes to {deadline:g}s",
                        lambda: self.apply(node, "time passes", env, (Tick(),), deadline)))
        return out

    # ---- one step --------------------------------------------------------------------------

    def apply(self, node: Node, label: str, env: Env, events: tuple[Event, ...],
              at: float | None = None) -> Node:
        """The state after ``events`` reached a copy of the machine (the machine itself while
        ``self._in_place``: a quiet continuation is one path), commands carried out."""
        m = node.machine if self._in_place else copy.deepcopy(node.machine)
        now = m.now if at is None else at
        trace = node.trace + (f"t={now:g}s {label}",)
        child = Node(m, env, trace, said=node.said)
        arrival, handed = None, m.actuation
        for event in events:
            full = None
            if isinstance(event, (RequestArrived, RequestEnded)):
                full = copy.deepcopy(m)  # the same event through the full pass, to compare
                full.quick_path = False
                shown = _shown(m)
            try:
                commands = m.handle(event, now)
                if full is not None:
                    self._same_as_full(m, commands, full, full.handle(event, now), trace)
                    if m.booked_only and _shown(m) != shown:
                        # the driver skips the view and the held gauges after such a pass
                        raise Violation("a one-pass booking changed the view, the held "
                                        f"counts or the deadline: {shown} -> {_shown(m)}", trace)
            except PolicyError as exc:
                raise Violation(f"PolicyError: {exc}", trace) from None
            if isinstance(event, RequestArrived):
                arrival = event
            try:
                for command in commands:
                    checks.carry_out(child, command)
            except checks.Unsafe as exc:
                raise Violation(str(exc), trace) from None
        if m.actuation is Actuation.HANDS_OFF and handed is not Actuation.HANDS_OFF:
            _drop_wishes(child, now)
        try:
            checks.check_state(child, now, arrival)
        except checks.Unsafe as exc:
            raise Violation(str(exc), trace) from None
        # (paced release only: unpaced, a held request's member is never routable for long
        # enough to matter, and the copy per state would double the search's time)
        if not self._in_place and child.env.held and m.limits.paced_release:
            overtaken = checks.overtakes(child)
            if overtaken:
                raise Violation(f"a new request for {overtaken} would pass the one held for "
                                "it (held requests go first)", trace)
        child.trace = trace[:-1] + (f"{trace[-1]}  [{m.stage.value}"
                                    f"{', ' + m.actuation.value if m.actuation.value != 'own' else ''}]",)
        return child

    @staticmethod
    def _same_as_full(m: PoolMachine, commands: list, full: PoolMachine, expected: list,
                      trace: tuple[str, ...]) -> None:
        """The one-pass path for a resident hit (or its end) leaves what the full pass does."""
        full.quick_path, full.booked_only = True, m.booked_only  # which path, not state
        if commands != expected or fingerprint(m) != fingerprint(full):
            raise Violation(f"the quick path differs from the full pass: {commands} vs "
                            f"{expected}", trace)

    # ---- no wedge --------------------------------------------------------------------------

    def quiet(self, node: Node, until: float, done: Callable[[Node], bool],
              path: list[object] | None = None) -> Node | None:
        """Let the environment go quiet from ``node`` (a copy: the path is walked in place):
        progress moves, then time, up to ``until`` or until ``done``. With ``path``, each
        state's key is collected, and None returned on reaching a state already checked
        (the rest of a quiet continuation is fixed by its state)."""
        node = Node(copy.deepcopy(node.machine), node.env, node.trace, dict(node.answers),
                    node.said)
        ticks, last = 0, node.machine.now
        self._in_place = True
        try:
            for _ in range(MAX_QUIET_STEPS):
                if path is not None:
                    k = key(node)
                    if k in self._verdicts:
                        return None
                    path.append(k)
                if done(node):
                    return node
                moves = [(label, make) for label, make in self.moves(node, quiet=True)
                         if not label.startswith("time")
                         or node.machine.next_deadline() <= until]
                if not moves:
                    return node
                label, make = moves[0]
                node = make()
                ticks = ticks + 1 if node.machine.now == last and label.startswith("time") else 0
                last = node.machine.now
                if ticks > MAX_TICKS_AT_ONE_TIME:
                    raise Violation("next_deadline() does not move on", node.trace)
        finally:
            self._in_place = False
        raise Violation("the quiet cluster never comes to rest (livelock)", node.trace)

    def never_wedged(self, node: Node) -> None:
        """From ``node`` gone quiet, the pool reaches (a), (b) or (c) of docs/guarantees.md."""
        path: list[object] = []
        rest = self.quiet(node, node.machine.now + self.scenario.quiet_horizon,
                          lambda n: False, path)
        if rest is not None:
            self.quiet_checked += 1
            if rest.machine.requests.held:
                raise Violation(f"still held after the quiet horizon: "
                                f"{list(rest.machine.held)}", rest.trace)
            swap = rest.machine.swap
            if swap is not None and swap.stage.value in ("Unloading", "Loading", "Triggered") \
                    and not swap.stalled and rest.machine.next_deadline() == float("inf"):
                raise Violation(f"the swap to {swap.target} waits at rest with no deadline: "
                                "it would never be said stalled", rest.trace)
            tracked = set(rest.machine.spec.members) | rest.machine.departing
            for name in NAMES:
                if name not in tracked and holds_gpu(rest.env.member(name)):
                    raise Violation(f"{name} holds the GPU at rest ({rest.env.member(name)}) "
                                    "and the pool no longer tracks it", rest.trace)
            for name in rest.machine.spec.members:
                self._served_after_quiet(rest, name)
        self._verdicts.update(path)

    def _served_after_quiet(self, rest: Node, name: str) -> None:
        env, m = rest.env, rest.machine
        rid = env.rid
        asked = self.apply(rest, f"(quiet) request {rid} for {name} arrives",
                           replace(env, rid=rid + 1), (RequestArrived(rid, name),))
        end = self.quiet(asked, asked.machine.now + m.spec.swap_budget + 1.0,
                         lambda n: rid in n.answers)
        assert end is not None
        answer = end.answers.get(rid)
        if answer == "admitted":
            return
        member = env.member(name)
        resident = env.status[0] if env.llmkube else m.resident
        serving = member.phase == PHASE_READY and member.replicas and member.pods
        if answer is None:
            raise Violation(f"request {rid} for {name} still held after its budget", end.trace)
        why = checks.blocked(env, m, name)
        # (clients that never end may keep the resident's own requests held by fairness, for
        # a swap that waits on them: only a stalled swap must let the resident serve)
        owed = serving and name == resident and not (env.endless and m.swap is not None
                                                     and not m.swap.stalled)
        if owed or not why:
            raise Violation(f"request {rid} for {name} refused after the cluster went quiet "
                            f"({answer}) though nothing outside the service blocks it",
                            end.trace)
        if "stuck" in why and answer.startswith("swap_budget_exceeded") \
                and not end.machine.view().stalled:
            # (c): a swap stuck on something outside says so (SwapStalled) by then
            raise Violation(f"request {rid} for {name} refused at its budget ({answer}) while "
                            f"{why}, and the pool does not say the swap is stalled", end.trace)
