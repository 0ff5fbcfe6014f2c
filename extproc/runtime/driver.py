"""One pool's asyncio driver: feeds the policy machine and carries its commands out.

The machine decides; this module only does what it says. Admissions for the resident
complete synchronously (no future, no task) so the hot path stays cheap; held requests get
a future that resolves when the machine admits or rejects them. Platform calls (scale,
idle probe) run as tasks; their results come back as events.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .. import metrics
from ..logs import get_logger
from ..policy.events import (
    Admit,
    Command,
    Event,
    Hold,
    IdleProbed,
    MemberObserved,
    Notice,
    ProbeIdle,
    Reject,
    RequestArrived,
    RequestEnded,
    Scale,
    SpecChanged,
    Tick,
)
from ..policy.machine import Limits, PoolMachine
from ..policy.model import MemberObservation, PoolKey, PoolSpec, PoolView

log = get_logger(__name__)
_request_ids = itertools.count(1)
# A scale the platform could not apply is asked again after these delays (doubling).
SCALE_RETRY_FIRST = 1.0
SCALE_RETRY_MAX = 30.0


class Platform(Protocol):
    """What the runtime needs from the platform layer (Kubernetes, or a static stand-in)."""

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Set a member's replicas; retry until done or cancelled."""

    async def probe_idle(self, key: PoolKey, member: str) -> bool | None:
        """Ask a member's runtime whether it is idle (None: cannot tell)."""

    def publish(self, view: PoolView) -> None:
        """Make the pool's status reflect ``view`` (non-blocking, latest wins)."""

    def notify(self, key: PoolKey, notice: Notice) -> None:
        """Tell operators about a swap event (non-blocking, best effort)."""


@dataclass(slots=True)
class Ticket:
    """One request's passage through a pool: its decision, or a future for it."""

    rid: int
    member: str
    decision: Admit | Reject | None = None
    held: bool = False  # parked at some point (counted in the held gauge until decided)
    deadline: float = 0.0
    held_since: float = 0.0
    waiter: asyncio.Future[Admit | Reject | None] | None = None
    ended: bool = False


class PoolDriver:
    """Runs one PoolMachine on the event loop and executes its commands."""

    def __init__(self, spec: PoolSpec, limits: Limits, platform: Platform, *,
                 clock: Callable[[], float] = time.monotonic, resident_hint: str = "",
                 pending_hint: str = "") -> None:
        self.key = spec.key
        self._platform = platform
        self._clock = clock
        self._machine = PoolMachine(spec, limits, clock(), resident_hint=resident_hint,
                                    pending_hint=pending_hint)
        self._tickets: dict[int, Ticket] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Latest replicas wanted per member, applied by one worker per member so that a
        # slow or retrying patch can never land after a newer one.
        self._desired: dict[str, int] = {}
        self._scalers: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._published_version = -1
        self._labels = (spec.key.namespace, spec.key.name)
        self._gauged_members: set[str] = set()
        self._closed = False

    @property
    def spec(self) -> PoolSpec:
        """The pool's current spec."""
        return self._machine.spec

    def tracks(self, member: str) -> bool:
        """Whether observations of ``member`` matter here (a member, or one departing)."""
        return member in self._machine.spec.members or member in self._machine.departing

    def view(self) -> PoolView:
        """The machine's current snapshot."""
        return self._machine.view()

    # ---- requests --------------------------------------------------------------------------

    def arrive(self, member: str) -> Ticket:
        """Register a request for ``member``; the ticket is decided now or holds a future."""
        ticket = Ticket(next(_request_ids), member)
        self._tickets[ticket.rid] = ticket
        self._feed(RequestArrived(ticket.rid, member))
        if ticket.decision is None:
            ticket.waiter = asyncio.get_running_loop().create_future()
        return ticket

    def end(self, ticket: Ticket) -> None:
        """The request's stream closed (finished, or its client left while held)."""
        if ticket.ended:
            return
        ticket.ended = True
        if self._tickets.pop(ticket.rid, None) is None:
            return  # already rejected: the machine forgot it
        if ticket.decision is None:  # its client left while it was held
            metrics.hold_ended(*self._labels, ticket.member, "disconnected",
                               self._clock() - ticket.held_since)
        self._feed(RequestEnded(ticket.rid))

    # ---- observations from the platform ---------------------------------------------------

    def observe(self, obs: MemberObservation) -> None:
        """A member's observed state changed."""
        self._feed(MemberObserved(obs))

    def respec(self, spec: PoolSpec) -> None:
        """The ModelPool's spec changed."""
        self._feed(SpecChanged(spec))

    def reject_held(self, code: str, message: str) -> None:
        """Answer every held request now with 503 (pool removed, or the process stopping)."""
        retry = self._machine.retry_after()
        for ticket in list(self._tickets.values()):
            if ticket.decision is None:
                self._on_reject(Reject(ticket.rid, 503, code, message, retry,
                                       self._clock() - ticket.held_since))
                self._feed(RequestEnded(ticket.rid))  # the machine forgets it too

    def close(self) -> None:
        """Reject every waiter, cancel background work and drop this pool's gauges."""
        self.reject_held("pool_removed", f"pool {self.key} is no longer served")
        self._closed = True
        if self._timer:
            self._timer.cancel()
        for task in self._tasks:
            task.cancel()
        metrics.pool_closed(*self._labels, self._gauged_members)
        self._gauged_members.clear()

    # ---- the loop --------------------------------------------------------------------------

    def _feed(self, event: Event) -> None:
        if self._closed:
            return
        commands = self._machine.handle(event, self._clock())
        if commands:
            self._execute(commands)
        machine = self._machine
        if machine.version != self._published_version:
            self._published_version = machine.version
            self._publish()
        deadline = machine.next_deadline()
        if deadline != self._timer_at:
            self._arm(deadline)

    def _execute(self, commands: list[Command]) -> None:
        for cmd in commands:
            if isinstance(cmd, Admit):
                self._on_admit(cmd)
            elif isinstance(cmd, Hold):
                self._on_hold(cmd)
            elif isinstance(cmd, Reject):
                self._on_reject(cmd)
            elif isinstance(cmd, Scale):
                self._desired[cmd.member] = cmd.replicas
                if cmd.member not in self._scalers:
                    self._scalers.add(cmd.member)
                    self._spawn(self._scale(cmd.member))
            elif isinstance(cmd, ProbeIdle):
                self._spawn(self._probe(cmd.member))
            elif isinstance(cmd, Notice):
                self._on_notice(cmd)

    def _on_admit(self, cmd: Admit) -> None:
        ticket = self._tickets.get(cmd.rid)
        if ticket is None:
            return
        if ticket.held:
            metrics.hold_ended(*self._labels, ticket.member, "admitted", cmd.held_for)
        self._decide(ticket, cmd)

    def _on_hold(self, cmd: Hold) -> None:
        ticket = self._tickets[cmd.rid]
        ticket.held, ticket.deadline, ticket.held_since = True, cmd.deadline, self._clock()
        metrics.request_held(*self._labels, ticket.member, cmd.coalesced)

    def _on_reject(self, cmd: Reject) -> None:
        ticket = self._tickets.pop(cmd.rid, None)
        if ticket is None:
            return
        if ticket.held:
            metrics.hold_ended(*self._labels, ticket.member, cmd.code, cmd.held_for)
        self._decide(ticket, cmd)

    def _decide(self, ticket: Ticket, decision: Admit | Reject) -> None:
        ticket.decision = decision
        if ticket.waiter is not None and not ticket.waiter.done():
            ticket.waiter.set_result(decision)

    def _on_notice(self, notice: Notice) -> None:
        ns, pool = self._labels
        metrics.notice(ns, pool, notice.kind)
        if notice.kind in ("SwapCompleted", "SwapFailed"):
            metrics.swap_finished(ns, pool, notice.source, notice.target,
                                  notice.kind == "SwapCompleted", notice.duration)
        elif notice.kind == "SwapDeferred":
            metrics.swap_deferred(ns, pool, notice.source, self._machine.view().resident)
        level = log.warning if notice.kind in ("SwapFailed", "MemberLost") else log.info
        level(notice.message, event=notice.kind, namespace=ns, pool=pool,
              member=notice.target or notice.source, source=notice.source,
              target=notice.target, duration_s=round(notice.duration, 3),
              released=notice.released)
        self._platform.notify(self.key, notice)

    def _publish(self) -> None:
        view = self._machine.view()
        metrics.pool_published(view, self._machine.spec.swap_budget, self._gauged_members)
        self._gauged_members = {m.name for m in view.members}
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

    def _spawn(self, coro: object) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _scale(self, member: str) -> None:
        applied, delay = None, SCALE_RETRY_FIRST
        try:
            while (wanted := self._desired[member]) != applied:
                try:
                    await self._platform.scale(self.key, member, wanted)
                    applied, delay = wanted, SCALE_RETRY_FIRST
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # The platform already retried what a retry can fix; this is a 403, a
                    # webhook's 422 ... Giving up would leave the machine waiting for a
                    # change that never comes, so keep asking, slowly, until an operator
                    # fixes the cause (the swap stays visible as Swapping meanwhile).
                    log.error("scale failed; will retry", namespace=self.key.namespace,
                              pool=self.key.name, member=member, replicas=wanted,
                              error=f"{type(exc).__name__}: {exc}", retry_in_s=delay)
                    await asyncio.sleep(delay)
                    delay = min(SCALE_RETRY_MAX, delay * 2)
        finally:
            self._scalers.discard(member)

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
