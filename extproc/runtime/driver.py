"""One pool's asyncio driver: feeds the policy machine and carries its commands out.

The machine decides and owns every request's state; this module only does what it says.
A ``Ticket`` is what one stream needs to wait for its answer: the request id, the member, the
decision, and a future when the request is held. Admissions for the resident complete
synchronously (no future, no task) so the hot path stays cheap. Scaling runs in ``scaling.Scaler``
(one worker per member); idle probes run as tasks whose answers come back as events. Gauges are read off the machine's
counts after each event, never moved by hand.

If the machine raises ``PolicyError`` it is broken (see ``policy/machine.py``): the driver
answers every held request 503 + Retry-After, refuses new ones, and logs it once.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from .. import metrics
from ..logs import get_logger
from ..platform.contract import CarryResult, Platform, PoolLoad
from ..policy.events import (AdmissionLease, Admit, CarryAnswered, CarrySlots,
                             Close, Command, Divert, DrainAnnounced, Dropped, Event, Hold,
                             IdleProbed, LeadershipChanged, MemberObserved, Notice,
                             PeersObserved, ProbeIdle, Reject, RequestArrived, RequestEnded,
                             Scale, SpecChanged, StatusObserved, Tick, Trigger,
                             WishesDropped)
from ..policy.admission import expected_wait
from ..policy.machine import Limits, PolicyError, PoolMachine
from ..policy.queues import PoolQueue, queue
from ..policy.model import (Actuation, MemberObservation, PeerState, PoolSpec, PoolStatus,
                            PoolView, StartHints)
from ..policy.replicas import announcement
from . import notices
from .scaling import Retry, Scaler

log = get_logger(__name__)
_request_ids = itertools.count(1)
Decision = Admit | Reject | Divert


@dataclass(slots=True)
class Ticket:
    """What one stream needs from its pool: its decision, or a future that brings it."""

    rid: int
    member: str
    decision: Decision | None = None
    deadline: float = 0.0  # when held: the latest the decision can come (monotonic clock)
    waiter: asyncio.Future[Decision | None] | None = None  # set only when the request is held
    ended: bool = False


class PoolDriver:
    """Runs one PoolMachine on the event loop and executes its commands."""

    def __init__(self, spec: PoolSpec, limits: Limits, platform: Platform, retry: Retry, *,
                 clock: Callable[[], float] = time.monotonic,
                 hints: StartHints = StartHints(), actuation: Actuation = Actuation.OWN,
                 auto: bool = False) -> None:
        self.key = spec.key
        self._platform = platform
        self._scaler = Scaler(platform, spec.key, retry)
        self._clock = clock
        self._machine = PoolMachine(spec, limits, clock(), hints, actuation=actuation,
                                    auto=auto)
        self._tickets: dict[int, Ticket] = {}  # rid -> the stream waiting on it
        self._tasks: set[asyncio.Task[None]] = set()  # idle probes under way
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._published: tuple | None = None  # what the last publish showed (see _shown)
        self._labels = (spec.key.namespace, spec.key.name)
        self._gauged_members: set[str] = set()
        self._held_by: dict[str, int] = {}  # the held counts the gauges show
        self._broken = ""
        self._after: list[Event] = []  # events a pass's commands caused, fed after the pass
        self._closed = False
        self._peers: tuple[PeerState, ...] = ()
        self._announcing = ""  # the drain target last handed to the platform
        self._load_mark: tuple = (0, (), ())  # what peers wait for: epoch, held for, streaming
        self._admit_until = self._machine.admit_until  # the admission Lease as last told

    @property
    def spec(self) -> PoolSpec:
        """The pool's current spec."""
        return self._machine.spec

    @property
    def broken(self) -> str:
        """Why the pool's machine broke ("" while it works)."""
        return self._broken

    def tracks(self, member: str) -> bool:
        """Whether observations of ``member`` matter here (a member, or one departing)."""
        return member in self._machine.spec.members or member in self._machine.departing

    def view(self) -> PoolView:
        """The machine's current snapshot."""
        return self._machine.view()

    def queue(self) -> PoolQueue:
        """The pool's queue per member, as of the last event (GET /pools/...)."""
        return queue(self._machine)

    def predicted_wait(self, member: str) -> float:
        """Seconds until ``member`` should serve (our 503s' x-modelpool-predicted-wait)."""
        return expected_wait(self._machine, member)

    # ---- requests --------------------------------------------------------------------------

    def arrive(self, member: str, max_wait: float = math.inf, activation: str = "",
               objective: str = "", priority: int | None = None) -> Ticket:
        """Register a request for ``member`` that waits at most ``max_wait`` seconds (the
        client's x-modelpool-max-wait) with its ``activation`` (x-modelpool-activation),
        ``objective`` and ``priority`` (priority.py); the ticket is decided now or holds a
        future."""
        ticket = Ticket(next(_request_ids), member)
        if self._broken or self._closed:
            ticket.decision = self._unavailable(ticket.rid, 0.0)
            return ticket
        self._tickets[ticket.rid] = ticket
        self._feed(RequestArrived(ticket.rid, member, max_wait, activation, objective, priority))
        return ticket

    def end(self, ticket: Ticket) -> None:
        """The request's stream closed (finished, or its client left while held)."""
        if ticket.ended:
            return
        ticket.ended = True
        if self._tickets.pop(ticket.rid, None) is not None:  # else rejected: already forgotten
            self._feed(RequestEnded(ticket.rid))

    # ---- observations from the platform ---------------------------------------------------

    def observe(self, obs: MemberObservation) -> None:
        """A member's observed state changed."""
        self._feed(MemberObserved(obs))

    def respec(self, spec: PoolSpec) -> None:
        """The ModelPool's spec changed."""
        self._feed(SpecChanged(spec))

    def observe_status(self, status: PoolStatus) -> None:
        """The ModelPool's status changed."""
        self._feed(StatusObserved(status))

    # ---- the other replicas -------------------------------------------------------------------

    def admission(self, until: float) -> None:
        """This replica may admit until ``until`` (its membership Lease).

        A renew that only pushes a running Lease further changes no decision until the
        machine's next event (nothing waits on the Lease's end: it is read, never timed), so
        it is handed over with that event; a lapsed or shortened Lease is handed over now.
        """
        extends = until >= self._admit_until > self._clock()
        self._admit_until = until
        if not extends:
            self._feed(AdmissionLease(until))

    def lead(self, leading: bool) -> None:
        """This replica gained or lost the pool's leader Lease."""
        if leading:
            self._feed(LeadershipChanged(True))
            return
        dropped = self._scaler.cancel()  # a wish of the leader we were must never land later
        self._feed(LeadershipChanged(False))
        self._feed(WishesDropped(dropped))

    def observe_peers(self, peers: tuple[PeerState, ...]) -> None:
        """The other replicas' counts for this pool."""
        if peers != self._peers:
            self._peers = peers
            self._feed(PeersObserved(peers))

    def announced(self, epoch: int, target: str) -> None:
        """The pool's drain announcement in force."""
        self._feed(DrainAnnounced(epoch, target))

    def load(self) -> PoolLoad:
        """This replica's counts for the pool, as its membership Lease publishes them."""
        book = self._machine.requests
        members = set(self._machine.spec.members) | self._machine.departing
        # Only a follower obeys the announcement: a leader (even one deposed that has not
        # noticed yet) acknowledges nothing, so no new leader unloads under its admissions.
        following = self._machine.actuation is Actuation.FOLLOW
        return PoolLoad(self._machine.drain[0] if following else 0,
                        {m: book.busy(m) for m in sorted(members) if book.busy(m)},
                        dict(book.held_by))

    def reject_held(self, code: str, message: str) -> None:
        """Answer every held request now with 503 ``code``, and any later one that would wait."""
        self._feed(Close(code, message))

    def close(self, code: str = "pool_removed", message: str = "") -> None:
        """Reject every waiter, cancel background work and drop this pool's gauges."""
        self.reject_held(code, message or f"pool {self.key} is no longer served")
        self._shut()
        metrics.pool_closed(*self._labels, self._gauged_members)
        self._gauged_members.clear()

    # ---- the loop --------------------------------------------------------------------------

    def _feed(self, event: Event) -> None:
        if self._closed:
            return
        machine = self._machine
        if machine.admit_until != self._admit_until and not isinstance(event, AdmissionLease):
            self._feed(AdmissionLease(self._admit_until))  # a renew put off (admission())
        try:
            commands = machine.handle(event, self._clock())
        except PolicyError as exc:
            self._break(exc)
            return
        for cmd in commands:
            self._execute(cmd)
        # A resident hit booked in one pass changes none of the view, the held counts and the
        # next deadline (the exhaustive search checks it), so none is derived again.
        booked_only = machine.booked_only
        if self._after:
            self._feed(self._after.pop(0))  # what this pass's commands caused, next
            return  # (that pass published and armed for both)
        if not booked_only:
            view = machine.view()
            shown = self._shown(view)
            if shown != self._published:
                self._published = shown
                self._publish(view)
            if machine.requests.held_by != self._held_by:
                self._count_held(machine.requests.held_by)
        self._tell_peers(machine)
        if not booked_only:
            deadline = machine.next_deadline()
            if deadline != self._timer_at:
                self._arm(deadline)

    def _execute(self, cmd: Command) -> None:
        match cmd:
            case Admit(rid):
                self._decide(self._tickets.get(rid), cmd, "admitted")
            case Reject(rid) | Divert(rid):
                self._decide(self._tickets.pop(rid, None), cmd, cmd.code
                             if isinstance(cmd, Reject) else "fallback")
            case Hold(rid=rid, member=member, deadline=deadline, coalesced=coalesced):
                ticket = self._tickets[rid]
                ticket.deadline = deadline
                ticket.waiter = asyncio.get_running_loop().create_future()
                if coalesced:
                    metrics.request_coalesced(*self._labels, member)
            case Dropped(member=member, held_for=held_for):
                metrics.hold_ended(*self._labels, member, "disconnected", held_for)
            case Scale(member, replicas):
                self._scaler.want(member, replicas)
            case Trigger(member):
                self._scaler.trigger(member)
            case ProbeIdle(member):
                self._spawn(self._probe(member))
            case CarrySlots(member, step):
                self._spawn(self._carry(member, step))
            case Notice():
                self._on_notice(cmd)

    def _tell_peers(self, machine: PoolMachine) -> None:
        """Hand a changed drain announcement to the platform, and ask for an early membership
        write when what peers wait for changed: the epoch we obey, the members we hold for,
        and (while a drain is announced) the members we still stream from."""
        want = announcement(machine)
        if want != self._announcing:
            self._announcing = want
            self._platform.announce(self.key, want)
        book, following = machine.requests, machine.actuation is Actuation.FOLLOW
        streaming = tuple(m for m in machine.spec.members if book.busy(m)) \
            if following and machine.drain[1] else ()
        mark = (machine.drain[0] if following else 0, tuple(book.held_by), streaming)
        if mark != self._load_mark:
            # a follower's epoch and the members it still streams from gate the leader's
            # drain: written at once; held counts (demand) are coalesced
            before = self._load_mark
            self._load_mark = mark
            self._platform.load_changed(mark[0] != before[0] or mark[2] != before[2])

    def _decide(self, ticket: Ticket | None, decision: Decision, outcome: str) -> None:
        if ticket is None:
            return
        ticket.decision = decision
        waiter = ticket.waiter
        if waiter is not None:
            # a Divert is decided at arrival and never held: 0 is only for the type checker
            held_for = getattr(decision, "held_for", 0.0)
            metrics.hold_ended(*self._labels, ticket.member, outcome, held_for)
            if not waiter.done():
                waiter.set_result(decision)

    def _break(self, exc: PolicyError) -> None:
        """The machine broke: answer its held requests, refuse new ones, say so once."""
        self._broken = str(exc)
        log.error("pool policy failed; its requests are refused until the process restarts",
                  namespace=self.key.namespace, pool=self.key.name, error=self._broken)
        now, held = self._clock(), self._machine.held
        for ticket in list(self._tickets.values()):
            if ticket.waiter is not None and not ticket.waiter.done():
                since = held[ticket.rid].arrived if ticket.rid in held else now
                self._decide(self._tickets.pop(ticket.rid),
                             self._unavailable(ticket.rid, now - since), "pool_unavailable")
        self._shut()
        self._count_held({})

    def _unavailable(self, rid: int, held_for: float) -> Reject:
        return Reject(rid, 503, "pool_unavailable", f"pool {self.key} is not available "
                      f"({self._broken or 'closed'}); retry shortly",
                      self._machine.limits.retry_after_default, held_for)

    def _shut(self) -> None:
        self._closed = True
        if self._timer:
            self._timer.cancel()
        for task in self._tasks:
            task.cancel()
        self._scaler.cancel()

    def _count_held(self, held_by: dict[str, int]) -> None:
        members = set(self._machine.spec.members) | set(self._held_by) | set(held_by)
        metrics.held_counts(*self._labels, held_by, members)
        self._held_by = dict(held_by)

    def _on_notice(self, notice: Notice) -> None:
        if not notices.report(notice, self.key, self._machine.actuation, self._machine.resident):
            return  # a follower's: the leader records the pool's Events
        if notice.kind == "ActuationChanged" and notice.target == Actuation.HANDS_OFF.value:
            # hands-off writes nothing: no wish of ours may land later; the machine hears
            # which ones died unsent once this pass is done
            self._after.append(WishesDropped(self._scaler.cancel()))
        self._platform.notify(self.key, notice)

    def _shown(self, view: PoolView) -> tuple:
        """What a publish shows: the view (held and in flight aside: gauges, not status, that
        change with every request), the spec (the budget gauge) and who writes the status."""
        return replace(view, held=0, in_flight=0), self._machine.spec, self._machine.actuation

    def _publish(self, view: PoolView) -> None:
        metrics.pool_published(view, self._machine.spec.swap_budget, self._gauged_members)
        self._gauged_members = {m.name for m in view.members}
        if self._machine.actuation is not Actuation.OWN and not view.hands_off:
            return  # in the other modes the status is someone else's (hands-off: it says so)
        if view.resident_idle_since is not None:
            # The machine's clock is monotonic; the status wants a wall-clock time.
            idle_for = self._clock() - view.resident_idle_since
            view = replace(view, resident_idle_since=time.time() - idle_for)
        self._platform.publish(view)

    def _arm(self, deadline: float) -> None:
        if self._timer:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline != math.inf:
            delay = max(0.0, deadline - self._clock())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        self._feed(Tick())

    # ---- platform calls --------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe(self, member: str) -> None:
        try:
            idle = await self._platform.probe_idle(self.key, member)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("idle probe failed", namespace=self.key.namespace, pool=self.key.name,
                        member=member, error=f"{type(exc).__name__}: {exc}")
            idle = None
        self._feed(IdleProbed(member, idle))

    async def _carry(self, member: str, step: str) -> None:
        """Save or restore ``member``'s slots, within the time the swap waits for it."""
        where = {"namespace": self.key.namespace, "pool": self.key.name, "member": member}
        timeout = self._machine.limits.carry_timeout
        try:
            result = await asyncio.wait_for(
                self._platform.carry_slots(self.key, member, step), timeout)
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            result = CarryResult(False, f"no answer within {timeout:g}s")
        except Exception as exc:
            result = CarryResult(False, f"{type(exc).__name__}: {exc}")
        metrics.prompt_cache_carried(*self._labels, member, step, result.ok, result.tokens)
        (log.info if result.ok else log.warning)(
            f"prompt cache {step} {'done' if result.ok else 'failed'}", **where, step=step,
            detail=result.detail, tokens=result.tokens, slots=result.slots)
        self._feed(CarryAnswered(member, step, result.ok, result.detail))
