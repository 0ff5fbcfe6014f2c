"""The swap policy of one pool: a pure, deterministic state machine (sans I/O).

The rules of the package (purity, who owns which state, broken machines) are in its
``__init__``; this file composes the pool's concerns and is the one place where they meet.

Invariants (the property tests in tests/policy check each of them)
------------------------------------------------------------------
1. At most one member is scaled up: the target is scaled up only when every other member
   has ``replicas == 0`` and **no pods left** (a terminating pod still holds GPU memory).
2. Drain before unload: a member with admitted requests in flight is never scaled down.
3. No admission to a member that is not resident and Ready.
4. Every held request ends admitted, rejected or abandoned, at the latest at its deadline
   (``swapBudget`` after it arrived).
5. Fairness: once a swap has waited ``fairness_window``, new requests for the incumbent are
   held too, so the incumbent drains and waiting requests get the slot.
6. A Degraded pool (a member does not exist) makes no replica changes.
7. Never wedged: once the cluster stops changing, within max(budget, hands-off quiet, the
   retried triggers, stall_after) the pool serves the member requests wait for, or has told
   every held request the truth, or says what outside it is stuck while its Ready resident
   serves (docs/guarantees.md, "Never wedged"; tests/policy/test_exhaustive.py searches every
   interleaving for a counterexample).

Theory of operation
-------------------
A request for the resident, Ready member is admitted at once (coalescing). Any other request
is held, and if no swap is under way one starts, targeting the member of the oldest held
request. A swap moves through stages; every edge, with its guard, is a row of
``swap.TRANSITIONS``, and the header of ``swap.py`` draws the graph.

The swap is never cancelled because its waiters left: it completes so the now-warm member
serves the next request. Edges are triggered by state (counts reaching zero, observations,
time), not by particular events: after every event the machine follows edges until none
applies, so any event order converges.
"""

from __future__ import annotations

import math

from dataclasses import replace
from operator import attrgetter

from . import (admission, autoscaled, carry, deadlines, fairness, landing, modes, pacing,
               priority, probecheck, replicas, snapshot, watchdog)
from .events import (ActuationChanged, AdmissionLease, Admit, CarryAnswered, Close, Command,
                     DrainAnnounced, Dropped, Event, Hold, IdleProbed, LeadershipChanged,
                     MemberObserved, Notice, PeersObserved, Reject, RequestArrived,
                     RequestEnded, Scale, SpecChanged, StatusObserved, Tick, WishesDropped)
from .forecast import SwapHistory
from .model import Actuation, MemberObservation, PoolSpec, PoolStatus, PoolView, StartHints
from .reclaim import PolicyMemory, report_policy, track_idle
from .requests import RequestBook
from .respec import respec
from .state import Limits, PolicyError, Stage, Swap
from .steps_llmkube import incoming, reject_blocked, track_activation
from .swap import advance

__all__ = ["Limits", "PolicyError", "PoolMachine"]


class PoolMachine:
    """Decides, for one pool, who owns the slot and when each request may pass."""

    def __init__(self, spec: PoolSpec, limits: Limits, now: float,
                 hints: StartHints = StartHints(), *, actuation: Actuation = Actuation.OWN,
                 auto: bool = False) -> None:
        self.spec = spec
        self.limits = limits
        self.now = now
        # Each concern's own state (see the module header).
        self.hands = modes.Hands(actuation, auto)
        self.fleet = replicas.Fleet(leading=None if actuation is Actuation.FOLLOW else True)
        self.policy_memory = PolicyMemory(resident_since=now)
        self.requests = RequestBook()
        self.history = SwapHistory(limits.retry_after_default, limits.retry_after_max)
        self.carry = carry.CarryBook()  # (carry.py: the slot saves and restores waited for)
        self.status = PoolStatus()  # the pool's .status as last observed (the rest: only here)
        self.obs: dict[str, MemberObservation] = {}
        self.resident = ""
        self.swap: Swap | None = None
        self.departing: set[str] = set()  # removed members that may still hold the GPU
        self.landing = landing.Landing()  # members a write of ours may still bring up
        self.failed_until: dict[str, float] = {}
        self.failed_message = ""
        self.deferred = ("", "")
        # An owner is picked by a request, by adoption, or by warming spec.default once.
        self.owner_picked = False
        self.hints = hints  # consulted once each: the first adoption, the first start
        self.closing: tuple[str, str] | None = None  # (code, message) after a Close
        # Members asked for by requests refused for their own deadline (admission.py): a
        # swap starts for them as for a held request. Insertion order: oldest first.
        self.wishes: dict[str, None] = {}
        self._broken = ""
        self._rest_until = -math.inf  # at rest (deadlines.at_rest) until then: see _quick
        self.quick_path = True  # (the exhaustive search turns it off to compare both paths)
        # The last event took that one pass: only the request book changed, so the view (held
        # and in-flight counts aside) and the held counts are as before it.
        self.booked_only = False

    # ---- public API --------------------------------------------------------------------
    held = property(attrgetter("requests.held"), doc="Held requests by id (the book's).")

    @property
    def stage(self) -> Stage:
        """Where the pool stands: Idle, or the stage of the swap under way."""
        return self.swap.stage if self.swap is not None else Stage.IDLE

    # Values of one concern that other concerns read, read back from their owners.
    actuation = property(attrgetter("hands.actuation"), doc="Who carries the swaps out.")
    drain = property(attrgetter("fleet.drain"), doc="The drain announcement: (epoch, target).")
    admit_until = property(attrgetter("fleet.admit_until"), doc="This replica admits till then.")
    peers = property(attrgetter("fleet.peers"), doc="The other replicas' membership Leases.")
    resident_since = property(attrgetter("policy_memory.resident_since"), doc="Resident since.")
    idle_shown = property(attrgetter("policy_memory.idle_shown"), doc="residentIdleSince.")
    hands_off = property(lambda self: modes.shown_hands_off(self.hands),
                         doc="Why own mode stopped actuating, for the status.")

    def handle(self, event: Event, now: float) -> list[Command]:
        """Apply one event at time ``now`` and return the commands it causes."""
        if self._broken:
            raise PolicyError(f"pool {self.spec.key} is broken: {self._broken}")
        if self.quick_path and self.now <= now < self._rest_until:
            quick = self._quick(event, now)
            self.booked_only = quick is not None
            if quick is not None:
                return quick
        self.booked_only = False
        try:
            out = self._handle(event, now)
        except PolicyError as exc:
            self._broken = str(exc)
            raise
        self._rest_until = deadlines.next_deadline(self, self.hands) if deadlines.at_rest(self) else -math.inf
        return out

    def _quick(self, event: Event, now: float) -> list[Command] | None:
        """One pass for a resident hit or the end of one in flight, at rest (None: a full
        pass decides): no edge is enabled, no deadline due, and booking it changes neither
        (deadlines.at_rest). The exhaustive search checks both paths leave the same state."""
        match event:
            case RequestArrived(rid, member) if member in self.spec.members \
                    and not self.requests.knows(rid):
                self.now = now
                if not self.routable(member) or not pacing.admits(self, member) \
                        or autoscaled.autoscaler(self, member):
                    return None
                self.owner_picked = True
                self.requests.arrived(member, now, self.limits.drain_linger)
                self.requests.admit(rid, member, now)
                return [Admit(rid, member, 0.0)]
            case RequestEnded(rid) if rid in self.requests.in_flight:
                self.now = now
                self.requests.end(rid, now)
                return []
        return None

    def next_deadline(self) -> float:
        """The earliest time at which a Tick would change something (inf if none)."""
        return deadlines.next_deadline(self, self.hands)

    def view(self) -> PoolView:
        """A snapshot for the status writer, metrics and logs."""
        return snapshot.view(self)

    def retry_after(self) -> int:
        """Seconds a client should wait before retrying: the expected rest of the swap."""
        swap, history = self.swap, self.history
        return history.retry_after(self.resident, self.spec.default) if swap is None else \
            history.retry_after(swap.incumbent, swap.target, self.now - swap.started)

    # ---- events --------------------------------------------------------------------------

    def _handle(self, event: Event, now: float) -> list[Command]:
        self.now = now = max(now, self.now)  # clocks handed in are monotonic; tolerate ties
        out: list[Command] = []
        hands, fleet = self.hands, self.fleet
        for member in [w for w in self.wishes if self.routable(w)]:
            del self.wishes[member]  # served already (adopted, or a swap a request drove)
        match event:
            case RequestArrived() as arrival:
                self._arrive(arrival, now, out)
            case RequestEnded(rid):
                held = self.requests.end(rid, now)
                if held is not None:
                    out.append(Dropped(rid, held.member, now - held.arrived))
            case MemberObserved(obs):
                self._observe(obs, out)
            case SpecChanged(spec):
                self._respec(spec, out)
            case IdleProbed(member, idle):
                out.extend(probecheck.probed_idle(self, member, idle))
                self._probed(member, idle)
            case StatusObserved(status):
                before, self.status = self.status, status
                modes.observe_status(self, hands, before, out)
            case ActuationChanged(actuation, reason):
                modes.switch(self, hands, actuation, reason, out)
            case LeadershipChanged(leading):
                modes.lead(self, hands, fleet.note_leadership(leading), leading, out)
            case AdmissionLease(until):
                fleet.admit_until = until
            case PeersObserved(peers):
                fleet.peers = peers
            case DrainAnnounced(epoch, target):
                replicas.observe_announcement(fleet, epoch, target)
            case Close(code, message):
                self.closing = (code, message)
                for rid, held in list(self.requests.held.items()):
                    self.requests.unhold(rid)
                    out.append(Reject(rid, 503, code, message, self.retry_after(),
                                      now - held.arrived))
            case CarryAnswered():
                carry.answered(self, event, out)
            case WishesDropped(reached):
                self.landing.dropped(dict(reached), now, self.limits.write_landing)
            case Tick():
                pass
            case _:
                raise PolicyError(f"unknown event {event!r}")
        if self.hands.fights.fight and modes.fought_by_controller(hands):
            # a controller that writes again: no edge of ours may answer its write first
            modes.settle_fight(self, hands, out)
        watchdog.watch(self, now, out)  # (first: a budget 503 at the stall's instant says so)
        self._expire(now, out)
        admission.shed(self, out)  # past the held bound, the lowest negative priority goes
        advance(self, now, out)
        if modes.settle_fight(self, hands, out) or modes.resume(self, hands, out):
            advance(self, now, out)
        watchdog.watch(self, now, out)
        if incoming(self) == "" and self.stage is Stage.TRIGGERED:
            advance(self, now, out)  # a trigger just marked stalled lets the resident serve
        track_activation(self, now)
        reject_blocked(self, now, out)
        replicas.track_announcement(fleet, self)
        track_idle(self.policy_memory, self, now)
        report_policy(self.policy_memory, self, out)
        return out

    def _arrive(self, arrival: RequestArrived, now: float, out: list[Command]) -> None:
        rid, member = arrival.rid, arrival.member
        if member not in self.spec.members:
            raise PolicyError(f"{member!r} is not a member of pool {self.spec.key}")
        if self.requests.knows(rid):
            raise PolicyError(f"request {rid} arrived twice")
        if autoscaled.autoscaler(self, member):
            out.append(autoscaled.reject(self, rid, member, 0.0))  # never swapped in
            return
        self.owner_picked = True
        # A return within the drain linger's cap is what makes an adaptive linger worth it.
        self.requests.arrived(member, now, self.limits.drain_linger)
        if self.routable(member) and not fairness.holds(self, member, now) \
                and pacing.admits(self, member):
            self.admit(rid, member, 0.0, out)
            return
        refusal = admission.refusal(self, self.hands, arrival)
        if refusal is not None:
            if refusal.wish:
                self.wishes[member] = None
            out.append(refusal.answer)
            return
        coalesced = self.swap is not None and self.swap.target == member
        deadline = now + self.spec.swap_budget
        self.requests.hold(rid, member, now, deadline, priority.of(self.spec, arrival))
        out.append(Hold(rid, member, deadline, coalesced))

    def _observe(self, obs: MemberObservation, out: list[Command]) -> None:
        self.landing.seen(obs, self.now)
        if obs.name in self.departing:
            self.obs[obs.name] = obs
            if obs.unloaded and not self.landing.may_land(obs.name, self.now):
                self.departing.discard(obs.name)  # gone for good: forget it
                del self.obs[obs.name]
            return
        if obs.name not in self.spec.members:
            raise PolicyError(f"{obs.name!r} is not a member of pool {self.spec.key}")
        before = self.obs.get(obs.name)
        out.extend(probecheck.scaled_down(self, before, obs))
        self.obs[obs.name] = obs
        if before is not None and before.replicas != obs.replicas:  # (hands-off: not ours)
            modes.foreign_write(self, self.hands)
        modes.note_writer(self, self.hands, before, obs, out)
        autoscaled.noticed(self, before, obs, out)
        modes.note_scaled_up(self.hands, obs.name, obs.replicas, self.now)
        swap = self.swap
        if swap is not None and obs.replicas > 0:
            # Scaled up again behind our back (kubectl, a GitOps sync) after our Scale(0),
            # or an event older than it: ask again (idempotent), else unload waits for ever.
            swap.scaled_down.discard(obs.name)
        if swap is not None and obs.name == swap.target \
                and swap.stage in (Stage.LOAD, Stage.TRIGGERED) and obs.phase != swap.phase_at_load:
            swap.saw_progress = True
        if obs.name == self.resident and not obs.ready and before is not None \
                and before.ready and (swap is None or obs.name not in (swap.target, swap.incumbent)):
            # Self-heal: the resident died out of band (OOM, node drain, spec edit). Stop
            # routing to it now; the next request for it drives a swap back. (In llmkube mode
            # residency is what LLMKube's status says; a dead resident is not routable.)
            if self.actuation is not Actuation.LLMKUBE:
                self.resident = ""
            out.append(Notice("MemberLost", f"resident member {obs.name} left Ready "
                              f"(phase {obs.phase or 'unknown'}, pods {obs.pods})",
                              source=obs.name))

    def _respec(self, spec: PoolSpec, out: list[Command]) -> None:
        change = respec(self, spec, out)
        self.spec, self.departing = spec, set(change.departing)
        for name in change.forgotten:
            del self.obs[name]
        if self.resident and self.resident not in spec.members:
            self.resident = ""
        self.wishes = {w: None for w in self.wishes if w in spec.members}

    def _probed(self, member: str, idle: bool | None) -> None:
        swap = self.swap
        if swap is None or swap.stage is not Stage.PROBE or member not in swap.probing:
            return  # a late answer for a probe the machine no longer waits for
        if idle:
            swap.probing.discard(member)
        elif swap.refused is None:
            swap.refused = (member, idle)  # the Probing -> Draining edge acts on it

    def _expire(self, now: float, out: list[Command]) -> None:
        self.failed_until = {name: t for name, t in self.failed_until.items() if t > now}
        out.extend(admission.budget_exceeded(self, rid, held)
                   for rid, held in self.requests.expired(now))

    # ---- what the edges change (pool.PoolWriter) ------------------------------------------

    def set_resident(self, member: str, since: float | None = None) -> None:
        """``member`` owns the slot ("" : none); ``since`` given, its idle clock starts then."""
        self.resident = member
        if since is not None:
            self.policy_memory.took_slot(member, since)
            self.requests.took_slot(member, self.spec.min_residency)

    def pick_owner(self) -> None:
        """An owner was picked: a cold pool no longer warms spec.default."""
        self.owner_picked = True

    def begin_swap(self, swap: Swap) -> None:
        """``swap`` is under way from now on (it picks the pool's owner)."""
        self.swap, self.owner_picked = swap, True

    def end_swap(self) -> None:
        """No swap is under way any more (completed, failed, cancelled or handed over)."""
        self.swap = None

    def forget_wish(self, member: str) -> None:
        """A swap to ``member`` starts: the wish for it is granted."""
        self.wishes.pop(member, None)

    def set_pending_hint(self, member: str) -> None:
        """Resume a swap to ``member`` next ("" : the hint is used up)."""
        self.hints = replace(self.hints, pending=member)

    def record_failure(self, member: str, until: float, reason: str) -> None:
        """``member`` failed to load: requests for it fail fast until ``until``."""
        self.failed_until[member], self.failed_message = until, reason

    def clear_failure(self, member: str) -> None:
        """``member`` loaded: its failure backoff ends now."""
        self.failed_until.pop(member, None)

    def admit(self, rid: int, member: str, held_for: float, out: list[Command],
              swap: str = "") -> None:
        """Let ``rid`` through to ``member`` and count it in flight."""
        self.requests.admit(rid, member, self.now)
        out.append(Admit(rid, member, held_for, swap))

    def scale(self, member: str, replicas: int, out: list[Command]) -> None:
        """Ask for ``member`` at ``replicas`` (own mode's only way to change replicas)."""
        self.hands.fights.asked(member, replicas)
        self.landing.asked(member, replicas, self.now, self.limits.write_landing)
        out.append(Scale(member, replicas))

    def defer(self, reason: str, message: str, out: list[Command]) -> None:
        """Record why the swap waits (SwapDeferred), telling operators once per reason."""
        if self.deferred != (reason, message):
            self.deferred = (reason, message)
            out.append(Notice("SwapDeferred", message, target=self.swap.target if self.swap
                              else "", source=reason))

    def clear_deferral(self) -> None:
        """The swap moves again: SwapDeferred goes back to False."""
        self.deferred = ("", "")

    # ---- what every concern reads (pool.PoolReader) ---------------------------------------

    def routable(self, member: str) -> bool:
        """May requests for ``member`` pass now? Serving, and this replica may admit."""
        return self.serving(member) and self.now < self.fleet.admit_until

    def serving(self, member: str) -> bool:
        """Resident and Ready, and (llmkube, follow) no other member coming in."""
        obs = self.obs.get(member)  # (llmkube mode: the status may name it before it is seen)
        if self.actuation is Actuation.HANDS_OFF:
            return obs is not None and obs.ready  # not ours to decide: the cluster's word
        if not member or member != self.resident or obs is None or not obs.ready \
                or carry.carrying(self, member):
            return False
        if self.actuation is Actuation.FOLLOW:
            return replicas.follower_admits(self, member)
        return self.actuation is not Actuation.LLMKUBE or incoming(self) in ("", member)

    def others(self) -> list[str]:
        """The members that must give up the slot for the swap under way."""
        target = self.swap.target if self.swap is not None else ""
        return [m for m in self.spec.members if m != target] + sorted(self.departing)

    def missing(self) -> tuple[str, ...]:
        """Members whose InferenceService does not exist (the pool is Degraded)."""
        return tuple(m for m in self.spec.members if m in self.obs and not self.obs[m].exists)
