"""The swap policy of one pool: a pure, deterministic state machine (sans I/O).

Rules of this package
---------------------
* Everything that decides who owns the pool's GPU slot, and when a request may pass, lives
  in ``extproc/policy``. Nothing here awaits, sleeps, reads a clock, or talks to gRPC or
  Kubernetes: callers feed events (with the current time) in and carry the returned
  commands out.
* This file handles events and owns the state; ``swap.py`` holds the transition table (the
  only place a stage changes); ``requests.py`` keeps every request's state and counts.
* An event that cannot happen in the current state (an unknown request id, a member that is
  not in the pool) is a caller bug and raises ``PolicyError``. The machine is then *broken*:
  every later call raises too, so no caller can go on with a half-changed machine whose
  commands were lost. The runtime answers the pool's held requests and closes it.

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

from . import modes, replicas, snapshot, watchdog
from .admission import refuse_now
from .events import (
    ActuationChanged,
    AdmissionLease,
    Admit,
    Close,
    Command,
    DrainAnnounced,
    Dropped,
    Event,
    Hold,
    IdleProbed,
    LeadershipChanged,
    MemberObserved,
    Notice,
    PeersObserved,
    Reject,
    RequestArrived,
    Scale,
    RequestEnded,
    SpecChanged,
    StatusObserved,
    Tick,
)
from .forecast import SwapHistory
from .model import (
    Actuation,
    MemberObservation,
    PeerState,
    PoolSpec,
    PoolStatus,
    PoolView,
    StartHints,
)
from .reclaim import idle_deadline, report_policy, track_idle
from .requests import RequestBook
from .respec import respec
from .state import Limits, PolicyError, Stage, Swap
from .steps import reask_at
from .steps_llmkube import blocked_reject, blocker, incoming, lost_at, reject_blocked, \
    track_activation
from .swap import advance

__all__ = ["Limits", "PolicyError", "PoolMachine"]


class PoolMachine:
    """Decides, for one pool, who owns the slot and when each request may pass."""

    def __init__(self, spec: PoolSpec, limits: Limits, now: float,
                 hints: StartHints = StartHints(), *, actuation: Actuation = Actuation.OWN,
                 auto: bool = False) -> None:
        self.spec = spec
        self.actuation = actuation
        self.auto = auto  # own until the status shows another controller, then llmkube
        self.auto_said = False  # (auto mode names its choice once per pool)
        self.status = PoolStatus()  # the pool's .status as last observed
        # Own mode's fight detector (modes.note_scaled_up): members we asked down -> seen at 0
        # since; and when each was scaled up again behind our back.
        self.asked_down: dict[str, bool] = {}
        self.undone: dict[str, list[float]] = {}
        self.fight = ""  # own mode: why we think someone scales against us ("" if not)
        self.hands_off = modes.HandsOff()  # own mode's spells of not actuating (modes.py)
        self.limits = limits
        self.obs: dict[str, MemberObservation] = {}
        self.resident = ""
        self.swap: Swap | None = None
        self.requests = RequestBook()
        # Members removed from the spec that may still hold the GPU (see _respec).
        self.departing: set[str] = set()
        self.failed_until: dict[str, float] = {}
        self.failed_message = ""
        self.history = SwapHistory(limits.retry_after_default, limits.retry_after_max)
        self.deferred = ("", "")
        # An owner is picked by a request, by adoption, or by warming spec.default once.
        self.owner_picked = False
        self.hints = hints  # consulted once each: the first adoption, the first start
        self.closing: tuple[str, str] | None = None  # (code, message) after a Close
        # Members asked for by requests refused for their own deadline (admission.py): a
        # swap starts for them as for a held request. Insertion order: oldest first.
        self.wishes: dict[str, None] = {}
        self.policy_reported = ""  # the unsupported swapPolicy last reported (reclaim.py)
        self.resident_was, self.resident_since = "", now  # when the resident took the slot
        self.idle_shown: float | None = None  # status.residentIdleSince (reclaim.track_idle)
        self.version = 0  # bumped whenever the status-relevant state changes
        # Several replicas (replicas.py): this replica's admission Lease, the others' counts,
        # and the pool's drain announcement (epoch, target) from its leader Lease.
        self.admit_until = math.inf
        self.leading: bool | None = None if actuation is Actuation.FOLLOW else True
        self.peers: tuple[PeerState, ...] = ()
        self.drain = (0, "")
        self.announcing = ""  # the target this leader last wanted announced
        self.now = now
        self._broken = ""

    # ---- public API --------------------------------------------------------------------

    @property
    def held(self) -> dict:
        """Held requests by id (read only; owned by the request book)."""
        return self.requests.held

    @property
    def stage(self) -> Stage:
        """Where the pool stands: Idle, or the stage of the swap under way."""
        return self.swap.stage if self.swap is not None else Stage.IDLE

    def handle(self, event: Event, now: float) -> list[Command]:
        """Apply one event at time ``now`` and return the commands it causes."""
        if self._broken:
            raise PolicyError(f"pool {self.spec.key} is broken: {self._broken}")
        try:
            return self._handle(event, now)
        except PolicyError as exc:
            self._broken = str(exc)
            raise

    def next_deadline(self) -> float:
        """The earliest time at which a Tick would change something (inf if none)."""
        times = [self.requests.next_deadline()]
        times.extend(self.failed_until.values())  # the status's failed member clears then
        times.extend((idle_deadline(self), watchdog.deadline(self), modes.resume_at(self),
                      lost_at(self)))
        swap = self.swap
        if swap is not None:
            if swap.stage is Stage.DRAIN:
                times.extend(t for t in (swap.probe_retry_at, self.calm_at(),
                                         *replicas.settle_times(self)) if t > self.now)
            if swap.stage in (Stage.LOAD, Stage.TRIGGERED):
                times.append(swap.load_started + self.limits.swap_timeout)
            if swap.stage is Stage.LOAD:
                times.append(reask_at(self))
        return min(times)

    def view(self) -> PoolView:
        """A snapshot for the status writer, metrics and logs."""
        return snapshot.view(self)

    def retry_after(self) -> int:
        """Seconds a client should wait before retrying: the expected rest of the swap."""
        swap = self.swap
        if swap is None:
            return self.history.retry_after(self.resident, self.spec.default)
        return self.history.retry_after(swap.incumbent, swap.target, self.now - swap.started)

    # ---- events --------------------------------------------------------------------------

    def _handle(self, event: Event, now: float) -> list[Command]:
        self.now = now = max(now, self.now)  # clocks handed in are monotonic; tolerate ties
        out: list[Command] = []
        for member in [w for w in self.wishes if self.routable(w)]:
            del self.wishes[member]  # served already (adopted, or a swap a request drove)
        match event:
            case RequestArrived(rid, member, max_wait):
                self._arrive(rid, member, max_wait, now, out)
            case RequestEnded(rid):
                held = self.requests.end(rid, now)
                if held is not None:
                    out.append(Dropped(rid, held.member, now - held.arrived))
            case MemberObserved(obs):
                self._observe(obs, out)
            case SpecChanged(spec):
                respec(self, spec, out)
            case IdleProbed(member, idle):
                self._probed(member, idle)
            case StatusObserved(status):
                modes.observe_status(self, status, out)
            case ActuationChanged(actuation, reason):
                modes.switch(self, actuation, reason, out)
            case LeadershipChanged(leading):
                modes.lead(self, leading, out)
            case AdmissionLease(until):
                self.admit_until = until
            case PeersObserved(peers):
                self.peers = peers
            case DrainAnnounced(epoch, target):
                replicas.observe_announcement(self, epoch, target)
            case Close(code, message):
                self.closing = (code, message)
                for rid, held in list(self.requests.held.items()):
                    self.requests.unhold(rid)
                    out.append(Reject(rid, 503, code, message, self.retry_after(),
                                      now - held.arrived))
            case Tick():
                pass
            case _:
                raise PolicyError(f"unknown event {event!r}")
        watchdog.watch(self, now, out)  # (first: a budget 503 at the stall's instant says so)
        self._expire(now, out)
        advance(self, now, out)
        if modes.settle_fight(self, out) or modes.resume(self, out):
            advance(self, now, out)
        watchdog.watch(self, now, out)
        if incoming(self) == "" and self.stage is Stage.TRIGGERED:
            advance(self, now, out)  # a trigger just marked stalled lets the resident serve
        track_activation(self, now)
        reject_blocked(self, now, out)
        replicas.track_announcement(self)
        track_idle(self, now)
        report_policy(self, out)
        return out

    def _arrive(self, rid: int, member: str, max_wait: float, now: float,
                out: list[Command]) -> None:
        if member not in self.spec.members:
            raise PolicyError(f"{member!r} is not a member of pool {self.spec.key}")
        if self.requests.knows(rid):
            raise PolicyError(f"request {rid} arrived twice")
        self.owner_picked = True
        # A return within the drain linger's cap is what makes an adaptive linger worth it;
        # only while the member serves: one that comes back after a swap away was not kept
        # waiting by a linger (a client alternating A, B, A would make every swap linger).
        if self.serving(member):
            self.requests.arrived(member, now, self.limits.drain_linger)
        if self.routable(member) and not self._fairness_holds(member, now):
            self.admit(rid, member, 0.0, out)
            return
        if now >= self.admit_until:
            out.append(Reject(rid, 503, replicas.UNAVAILABLE_CODE, replicas.unavailable_message(), 1))
            return
        failed_until = self.failed_until.get(member, 0.0)
        if failed_until > now:
            out.append(Reject(rid, 503, "member_failed",
                              f"model {member!r} failed to load: {self.failed_message}",
                              max(1, math.ceil(failed_until - now))))
            return
        if blocker(self) not in ("", member):
            out.append(blocked_reject(self, rid, member, 0.0))
            return
        if self.missing():
            out.append(Reject(rid, 503, "pool_degraded",
                              f"pool {self.spec.key} is degraded: member(s) "
                              f"{', '.join(self.missing())} do not exist",
                              self.limits.retry_after_default))
            return
        if self.closing is not None:
            out.append(Reject(rid, 503, *self.closing, self.retry_after()))
            return
        if self.actuation is Actuation.HANDS_OFF:
            out.append(modes.conflict_reject(self, rid, 0.0))
            return
        if refuse_now(self, rid, member, max_wait, out):
            return
        coalesced = self.swap is not None and self.swap.target == member
        deadline = now + self.spec.swap_budget
        self.requests.hold(rid, member, now, deadline)
        out.append(Hold(rid, member, deadline, coalesced))

    def _observe(self, obs: MemberObservation, out: list[Command]) -> None:
        if obs.name in self.departing:
            self.obs[obs.name] = obs
            if obs.unloaded:
                self.departing.discard(obs.name)  # gone for good: forget it
                del self.obs[obs.name]
            return
        if obs.name not in self.spec.members:
            raise PolicyError(f"{obs.name!r} is not a member of pool {self.spec.key}")
        before = self.obs.get(obs.name)
        self.obs[obs.name] = obs
        if before != obs:
            self.version += 1
        if before is not None and before.replicas != obs.replicas:
            modes.foreign_write(self)  # (hands-off scales nothing: any change is someone else's)
        modes.note_scaled_up(self, obs.name, obs.replicas, self.now)
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
                self.version += 1
            out.append(Notice("MemberLost", f"resident member {obs.name} left Ready "
                              f"(phase {obs.phase or 'unknown'}, pods {obs.pods})",
                              source=obs.name))

    def _probed(self, member: str, idle: bool | None) -> None:
        swap = self.swap
        if swap is None or swap.stage is not Stage.PROBE or member not in swap.probing:
            return  # a late answer for a probe the machine no longer waits for
        if idle:
            swap.probing.discard(member)
        elif swap.refused is None:
            swap.refused = (member, idle)  # the Probing -> Draining edge acts on it

    def _expire(self, now: float, out: list[Command]) -> None:
        for member, until in list(self.failed_until.items()):
            if until <= now:
                del self.failed_until[member]
                self.version += 1  # view().failed_member changes with it
        for rid, held in self.requests.expired(now):
            out.append(Reject(rid, 503, "swap_budget_exceeded",
                              f"model {held.member!r} did not become ready within the "
                              f"pool's swap budget ({self.spec.swap_budget:g}s); "
                              f"{self._swap_state(held.member)}", self.retry_after(),
                              now - held.arrived))

    def _swap_state(self, member: str) -> str:
        """What a request refused at its budget is told of the swap: only what is true."""
        swap = self.swap
        if swap is None:
            return "no swap is under way for it now; retry after Retry-After"
        if swap.stalled:
            return f"the swap to {swap.target} is stalled: {swap.stalled}"
        if self.deferred[0]:
            return f"the swap to {swap.target} is deferred: {self.deferred[1]}"
        if swap.target != member:
            return f"the swap to {swap.target} under way comes first; retry shortly"
        return "the swap continues, retry shortly"

    # ---- shared by the events and the transitions -----------------------------------------

    def admit(self, rid: int, member: str, held_for: float, out: list[Command]) -> None:
        """Let ``rid`` through to ``member`` and count it in flight."""
        self.requests.admit(rid, member)
        out.append(Admit(rid, member, held_for))

    def scale(self, member: str, replicas: int, out: list[Command]) -> None:
        """Ask for ``member`` at ``replicas`` (own mode's only way to change replicas)."""
        if replicas:
            self.asked_down.pop(member, None)
        else:
            self.asked_down[member] = False
        out.append(Scale(member, replicas))

    def routable(self, member: str) -> bool:
        """May requests for ``member`` pass now? Serving, and this replica may admit."""
        return self.serving(member) and self.now < self.admit_until

    def serving(self, member: str) -> bool:
        """Resident and Ready, and (llmkube, follow) no other member coming in."""
        obs = self.obs.get(member)  # (llmkube mode: the status may name it before it is seen)
        if self.actuation is Actuation.HANDS_OFF:
            return obs is not None and obs.ready  # not ours to decide: the cluster's word
        if not member or member != self.resident or obs is None or not obs.ready:
            return False
        if self.actuation is Actuation.FOLLOW:
            return replicas.follower_admits(self, member)
        return self.actuation is not Actuation.LLMKUBE or incoming(self) in ("", member)

    def fairness_due(self, swap: Swap, now: float) -> bool:
        """True once ``swap`` has waited its pool's fairness window (never when it is 0)."""
        window = self.spec.fairness_window
        return window > 0 and now - swap.started >= window

    def calm_at(self) -> float:
        """When the members giving up the slot will have been idle for their drain linger."""
        swap = self.swap
        if swap is None or self.fairness_due(swap, self.now):
            return -math.inf
        book, cap = self.requests, self.limits.drain_linger
        return max((book.idle_since(m) + book.linger(m, self.now, cap) for m in self.others()),
                   default=-math.inf)

    def others(self) -> list[str]:
        """The members that must give up the slot for the swap under way."""
        target = self.swap.target if self.swap is not None else ""
        return [m for m in self.spec.members if m != target] + sorted(self.departing)

    def missing(self) -> tuple[str, ...]:
        """Members whose InferenceService does not exist (the pool is Degraded)."""
        return tuple(m for m in self.spec.members if m in self.obs and not self.obs[m].exists)

    def defer(self, reason: str, message: str, out: list[Command]) -> None:
        """Record why the swap waits (SwapDeferred), telling operators once per reason."""
        if self.deferred != (reason, message):
            self.deferred = (reason, message)
            self.version += 1
            out.append(Notice("SwapDeferred", message, target=self.swap.target if self.swap
                              else "", source=reason))

    def clear_deferral(self) -> None:
        """The swap moves again: SwapDeferred goes back to False."""
        if self.deferred != ("", ""):
            self.deferred = ("", "")
            self.version += 1

    def _fairness_holds(self, member: str, now: float) -> bool:
        """True when ``member`` is the incumbent of a swap that has waited long enough."""
        swap = self.swap
        return swap is not None and swap.target != member and self.fairness_due(swap, now)
