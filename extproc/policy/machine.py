"""The swap policy of one pool: a pure, deterministic state machine (sans I/O).

Rules of this file
------------------
* Everything that decides who owns the pool's GPU slot, and when a request may pass, lives
  here. Nothing here awaits, sleeps, reads a clock, or talks to gRPC or Kubernetes: callers
  feed events (with the current time) in and carry the returned commands out.
* An event that cannot happen in the current state (an unknown request id, a member that is
  not in the pool) is a caller bug and raises ``PolicyError``; it is never ignored.

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

Theory of operation
-------------------
A request for the resident, Ready member is admitted at once (coalescing). Any other request
is held, and if no swap is under way one starts, targeting the member of the oldest held
request. A swap moves through stages::

    DRAIN  --others idle-->  [PROBE --runtime idle-->]  UNLOAD  --others gone-->  LOAD
    LOAD   --target Ready--> done: held requests for the target admitted together
    LOAD   --target Failed / swap_timeout--> failed: its held requests rejected fast

The swap is never cancelled because its waiters left: it completes so the now-warm member
serves the next request. The stage transitions are all in ``_advance``; they are triggered
by state (counts reaching zero, observations), not by particular events, so any event order
converges.
"""

from __future__ import annotations

import heapq
import math

from .events import (
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
from .forecast import SwapHistory
from .model import PHASE_FAILED, MemberObservation, PoolPhase, PoolSpec, PoolView
from .state import Held, Limits, PolicyError, Stage, Swap

__all__ = ["Limits", "PolicyError", "PoolMachine", "STAGE_STEPS"]

# While the idle gate says busy (or cannot tell), ask again after this long.
PROBE_RETRY_SECONDS = 1.0


class PoolMachine:
    """Decides, for one pool, who owns the slot and when each request may pass."""

    def __init__(self, spec: PoolSpec, limits: Limits, now: float, *,
                 resident_hint: str = "", pending_hint: str = "") -> None:
        self.spec = spec
        self.limits = limits
        self.obs: dict[str, MemberObservation] = {}
        self.resident = ""
        self.swap: Swap | None = None
        self.in_flight: dict[int, str] = {}
        self._busy: dict[str, int] = {}
        self._idle_since: dict[str, float] = {}  # when each member's last request ended
        # Members removed from the spec that may still hold the GPU (see _respec).
        self.departing: set[str] = set()
        self.held: dict[int, Held] = {}
        # (deadline, rid) of held requests; entries of requests no longer held are skipped
        # lazily, so every event costs O(log n) even with thousands of requests parked.
        self._deadlines: list[tuple[float, int]] = []
        self._failed_until: dict[str, float] = {}
        self._failed_message = ""
        self._history = SwapHistory(limits.retry_after_default, limits.retry_after_max)
        self._deferred = ("", "")
        # An owner is picked by a request, by adoption, or by warming spec.default once.
        self._owner_picked = False
        self._resident_hint = resident_hint
        self._pending_hint = pending_hint
        self.version = 0  # bumped whenever the status-relevant state changes
        self._now = now

    # ---- public API --------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Command]:
        """Apply one event at time ``now`` and return the commands it causes."""
        if now < self._now:
            now = self._now  # clocks handed in are monotonic; tolerate equal readings
        self._now = now
        out: list[Command] = []
        match event:
            case RequestArrived(rid, member):
                self._arrive(rid, member, now, out)
            case RequestEnded(rid):
                self._end(rid, now, out)
            case MemberObserved(obs):
                self._observe(obs, out)
            case SpecChanged(spec):
                self._respec(spec, out)
            case IdleProbed(member, idle):
                self._probed(member, idle, now, out)
            case Tick():
                pass
            case _:
                raise PolicyError(f"unknown event {event!r}")
        self._expire(now, out)
        self._advance(now, out)
        return out

    def next_deadline(self) -> float:
        """The earliest time at which a Tick would change something (inf if none)."""
        self._drop_stale_deadlines()
        times = [self._deadlines[0][0]] if self._deadlines else []
        times.extend(self._failed_until.values())  # the status's failed member clears then
        if self.swap is not None:
            times.append(self.swap.probe_retry_at)
            times.append(self.swap.linger_until)
            if self.swap.stage is Stage.LOAD:
                times.append(self.swap.load_started + self.limits.swap_timeout)
        return min(times, default=math.inf)

    def view(self) -> PoolView:
        """A snapshot for the status writer, metrics and logs."""
        missing = self._missing()
        if missing:
            phase = PoolPhase.DEGRADED
        elif self.swap is not None:
            phase = PoolPhase.SWAPPING
        elif self._routable(self.resident):
            phase = PoolPhase.READY
        else:
            phase = PoolPhase.PENDING
        failed = next((m for m, t in self._failed_until.items() if t > self._now), "")
        return PoolView(
            key=self.spec.key, phase=phase, resident=self.resident,
            pending=self.swap.target if self.swap else "",
            members=tuple(self.obs.get(m, MemberObservation(m, exists=False, phase=""))
                          for m in self.spec.members),
            generation=self.spec.generation, missing_members=missing,
            deferred_reason=self._deferred[0], deferred_message=self._deferred[1],
            failed_member=failed, failed_message=self._failed_message if failed else "",
            held=len(self.held), in_flight=len(self.in_flight))

    def retry_after(self) -> int:
        """Seconds a client should wait before retrying: the expected rest of the swap."""
        return self._history.retry_after(
            self._now - self.swap.started if self.swap is not None else None)

    # ---- events --------------------------------------------------------------------------

    def _arrive(self, rid: int, member: str, now: float, out: list[Command]) -> None:
        if member not in self.spec.members:
            raise PolicyError(f"{member!r} is not a member of pool {self.spec.key}")
        if rid in self.held or rid in self.in_flight:
            raise PolicyError(f"request {rid} arrived twice")
        self._owner_picked = True
        if self._routable(member) and not self._fairness_holds(member, now):
            self._admit(rid, member, 0.0, out)
            return
        failed_until = self._failed_until.get(member, 0.0)
        if failed_until > now:
            out.append(Reject(rid, 503, "member_failed",
                              f"model {member!r} failed to load: {self._failed_message}",
                              max(1, math.ceil(failed_until - now))))
            return
        if self._missing():
            out.append(Reject(rid, 503, "pool_degraded",
                              f"pool {self.spec.key} is degraded: member(s) "
                              f"{', '.join(self._missing())} do not exist",
                              self.limits.retry_after_default))
            return
        coalesced = self.swap is not None and self.swap.target == member
        self.held[rid] = Held(member, now, now + self.spec.swap_budget)
        heapq.heappush(self._deadlines, (now + self.spec.swap_budget, rid))
        out.append(Hold(rid, member, now + self.spec.swap_budget, coalesced))

    def _end(self, rid: int, now: float, out: list[Command]) -> None:
        member = self.in_flight.pop(rid, None)
        if member is not None:
            self._busy[member] -= 1
            if not self._busy[member]:
                self._idle_since[member] = now
            return
        if self.held.pop(rid, None) is None:
            raise PolicyError(f"request {rid} ended but is neither held nor in flight")

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
        swap = self.swap
        if swap is not None and obs.replicas > 0:
            # Scaled up again behind our back (kubectl, a GitOps sync) after our Scale(0),
            # or an event older than it: ask again (idempotent), else unload waits for ever.
            swap.scaled_down.discard(obs.name)
        if swap is not None and obs.name == swap.target and swap.scaled_up \
                and obs.phase != swap.phase_at_load:
            swap.saw_progress = True
        if obs.name == self.resident and not obs.ready and before is not None \
                and before.ready and (swap is None or swap.target != obs.name):
            # Self-heal: the resident died out of band (OOM, node drain, spec edit). Stop
            # routing to it now; the next request for it drives a swap back.
            self.resident = ""
            self.version += 1
            out.append(Notice("MemberLost", f"resident member {obs.name} left Ready "
                              f"(phase {obs.phase or 'unknown'}, pods {obs.pods})",
                              source=obs.name))

    def _respec(self, spec: PoolSpec, out: list[Command]) -> None:
        if spec.key != self.spec.key:
            raise PolicyError(f"spec for {spec.key} sent to pool {self.spec.key}")
        self.spec = spec
        self.version += 1
        for name in list(self.obs):
            if name in spec.members:
                self.departing.discard(name)  # added back
            elif self.obs[name].unloaded and not self._busy.get(name, 0):
                del self.obs[name]
            else:
                # Removed while it holds the GPU (or serves requests): it still counts for
                # the slot until it is drained and unloaded like any other non-target member.
                self.departing.add(name)
        # Requests for members that left the pool can never be served.
        for rid, held in list(self.held.items()):
            if held.member not in spec.members:
                del self.held[rid]
                out.append(Reject(rid, 404, "model_not_found",
                                  f"model {held.member!r} was removed from pool {spec.key}",
                                  0, self._now - held.arrived))
        if self.resident and self.resident not in spec.members:
            self.resident = ""
        if self.swap is not None and self.swap.target not in spec.members:
            self.swap = None  # nothing left to load; its held requests were rejected above

    def _probed(self, member: str, idle: bool | None, now: float, out: list[Command]) -> None:
        swap = self.swap
        if swap is None or swap.stage is not Stage.PROBE or member not in swap.probing:
            return  # a late answer for a probe the machine no longer waits for
        if idle:
            swap.probing.discard(member)
            return
        reason = "PodsBusy" if idle is False else "IdleCheckFailed"
        text = (f"{member} reports requests in progress" if idle is False
                else f"cannot reach {member}'s runtime to confirm it is idle")
        self._defer(reason, f"swap to {swap.target} deferred: {text}", out)
        swap.probing.clear()
        swap.stage = Stage.DRAIN
        swap.probe_retry_at = now + PROBE_RETRY_SECONDS

    # ---- time ----------------------------------------------------------------------------

    def _is_current(self, deadline: float, rid: int) -> bool:
        # Request ids are reused once a request ends: an entry is stale unless that rid is
        # held now *with this deadline*, else a reused rid would expire on its old deadline.
        held = self.held.get(rid)
        return held is not None and held.deadline == deadline

    def _drop_stale_deadlines(self) -> None:
        heap = self._deadlines
        while heap and not self._is_current(*heap[0]):
            heapq.heappop(heap)

    def _expire(self, now: float, out: list[Command]) -> None:
        for member, until in list(self._failed_until.items()):
            if until <= now:
                del self._failed_until[member]
                self.version += 1  # view().failed_member changes with it
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, rid = heapq.heappop(heap)
            if self._is_current(deadline, rid):
                held = self.held.pop(rid)
                out.append(Reject(rid, 503, "swap_budget_exceeded",
                                  f"model {held.member!r} did not become ready within the "
                                  f"pool's swap budget ({self.spec.swap_budget:g}s); the swap "
                                  "continues, retry shortly", self.retry_after(),
                                  now - held.arrived))
        swap = self.swap
        if swap is not None and swap.probe_retry_at <= now:
            # The retry pause is over even if _step cannot act now (Degraded, a member not
            # yet observed): left set, next_deadline() would stay in the past and spin.
            swap.probe_retry_at = math.inf
        if swap is not None and swap.linger_until <= now:
            swap.linger_until = math.inf
        # Same arithmetic as next_deadline(): a Tick at that deadline must fire the timeout.
        if swap is not None and swap.stage is Stage.LOAD \
                and now >= swap.load_started + self.limits.swap_timeout:
            self._fail_swap(f"{swap.target} not Ready after {self.limits.swap_timeout:g}s",
                            now, out)

    # ---- the swap engine -----------------------------------------------------------------

    def _advance(self, now: float, out: list[Command]) -> None:
        """Move the swap along as far as the current state allows (state-triggered)."""
        if any(m not in self.obs for m in self.spec.members):
            return  # decide nothing before the cluster has been seen in full
        for _ in range(4 * len(self.spec.members) + 8):  # each pass moves one step
            if not self._step(now, out):
                return
        raise PolicyError("swap engine did not settle")  # a bug: transitions must converge

    def _step(self, now: float, out: list[Command]) -> bool:
        swap = self.swap
        if swap is None:
            return self._maybe_start(now, out)
        if self._missing():
            # Degraded: make no replica changes until members exist again. A target that is
            # already Ready still takes the slot (no replica changes), else the swap would
            # sit until swap_timeout and then fail a serving member.
            if swap.stage is Stage.LOAD and swap.scaled_up and self.obs[swap.target].ready:
                self._complete_swap(now, out)
                return True
            return False
        others = [m for m in self.spec.members if m != swap.target] + sorted(self.departing)
        return STAGE_STEPS[swap.stage](self, swap, others, now, out)

    # ---- one method per stage; STAGE_STEPS below is the transition table --------------------
    # Each returns True when it moved the swap (so _advance runs another pass).

    def _drain(self, swap: Swap, others: list[str], now: float, out: list[Command]) -> bool:
        """DRAIN -> PROBE | UNLOAD once no other member has a request in flight."""
        if now < swap.probe_retry_at and swap.probe_retry_at != math.inf:
            return False
        swap.probe_retry_at = math.inf
        if any(self._busy.get(m, 0) for m in others):
            return False
        if not self._fairness_due(swap, now):
            # Batching: back-to-back clients leave the incumbent idle for only a moment
            # between requests. Flipping in that gap would swap once per request under
            # interleaved traffic; lingering lets it keep serving its demand until the
            # fairness window ends, after which its new requests are held and it drains.
            calm_at = max((self._idle_since.get(m, -math.inf) for m in others),
                          default=-math.inf) + self.limits.drain_linger
            if now < calm_at:
                swap.linger_until = calm_at
                return False
        swap.linger_until = math.inf
        # Only a serving member can be busy: one that crashed (CrashLoop, Failed) would never
        # answer the probe and would block the swap that heals the pool.
        live = [m for m in others if self.obs[m].ready]
        if self.limits.idle_gate and live:
            swap.stage, swap.probing = Stage.PROBE, set(live)
            out.extend(ProbeIdle(m) for m in live)
            return True
        swap.stage = Stage.UNLOAD
        return True

    def _probe(self, swap: Swap, others: list[str], now: float, out: list[Command]) -> bool:
        """PROBE -> UNLOAD when every runtime says idle; back to DRAIN if a request came in."""
        if any(self._busy.get(m, 0) for m in others):
            swap.stage, swap.probing = Stage.DRAIN, set()
            return True
        if swap.probing:
            return False
        swap.stage = Stage.UNLOAD
        return True

    def _unload(self, swap: Swap, others: list[str], now: float, out: list[Command]) -> bool:
        """UNLOAD -> LOAD once every other member is scaled to zero and its pods are gone."""
        if any(self._busy.get(m, 0) for m in others):
            raise PolicyError("a member with requests in flight is being unloaded")
        for m in others:
            if self.obs[m].replicas > 0 and m not in swap.scaled_down:
                swap.scaled_down.add(m)
                out.append(Scale(m, 0))
            if m == self.resident:
                self.resident = ""
                self.version += 1
        if not all(self.obs[m].unloaded for m in others):
            return False  # wait for pods to be gone, not for phase Stopped
        self._clear_deferral()
        swap.stage, swap.load_started = Stage.LOAD, now
        self.version += 1
        return True

    def _load(self, swap: Swap, others: list[str], now: float, out: list[Command]) -> bool:
        """LOAD -> done when the target is Ready; -> failed when it reports Failed."""
        target = self.obs[swap.target]
        if not swap.scaled_up:
            swap.scaled_up, swap.phase_at_load = True, target.phase
            if target.replicas < 1:
                out.append(Scale(swap.target, 1))
            else:
                swap.saw_progress = True  # already asked up: its phase is current
            return True
        if target.ready:
            self._complete_swap(now, out)
            return True
        if target.phase == PHASE_FAILED and swap.saw_progress:
            self._fail_swap(f"{swap.target} reported phase Failed", now, out)
            return True
        return False

    def _maybe_start(self, now: float, out: list[Command]) -> bool:
        self._release_routable(now, out)
        if self._missing():
            return False
        target = self._next_target()
        if not target:
            return False
        self._owner_picked = True
        self.swap = Swap(target=target, incumbent=self.resident, started=now)
        self.version += 1
        out.append(Notice("SwapStarted", f"swap {self.resident or '(none)'} -> {target} "
                          "started", source=self.resident, target=target))
        return True

    def _next_target(self) -> str:
        """The member the slot should go to next, or "" to stay put."""
        self._adopt()
        hint, self._pending_hint = self._pending_hint, ""  # consulted once, at start-up
        if hint in self.spec.members and not self._routable(hint):
            return hint  # resume the swap a previous process started
        for held in self.held.values():  # oldest first: insertion order
            if not self._routable(held.member):
                return held.member
        scaled = [m for m in self.spec.members if self.obs[m].replicas > 0]
        if self._routable(self.resident) and len(scaled) > 1:
            return self.resident  # a second member was scaled up behind our back: undo it
        if not self.resident and not self._owner_picked and self.spec.default \
                and all(o.unloaded for o in self.obs.values()):
            return self.spec.default  # cold pool: warm the default member
        return ""

    def _adopt(self) -> None:
        """With no resident, take a member that is already Ready (start-up, self-heal)."""
        if self.resident:
            return
        ready = [m for m in self.spec.members if self.obs[m].ready]
        if ready:
            self.resident = self._resident_hint if self._resident_hint in ready else ready[0]
            self._owner_picked = True
            self.version += 1

    def _release_routable(self, now: float, out: list[Command]) -> None:
        """With no swap under way, admit held requests whose member is serving.

        Normally none exist (a swap's completion releases its own). They appear when a
        spec change cancels a swap while requests for the incumbent were held by fairness.
        """
        for rid, held in list(self.held.items()):
            if self._routable(held.member):
                del self.held[rid]
                self._admit(rid, held.member, now - held.arrived, out)

    def _complete_swap(self, now: float, out: list[Command]) -> None:
        swap = self.swap
        assert swap is not None
        self.swap = None
        self.resident = swap.target
        self.version += 1
        duration = now - swap.started
        self._history.record(duration)
        self._failed_until.pop(swap.target, None)
        released = 0
        for rid, held in list(self.held.items()):
            if held.member == swap.target:
                del self.held[rid]
                self._admit(rid, held.member, now - held.arrived, out)
                released += 1
        out.append(Notice("SwapCompleted", f"swap {swap.incumbent or '(none)'} -> "
                          f"{swap.target} completed in {duration:.1f}s, {released} released",
                          source=swap.incumbent, target=swap.target, duration=duration,
                          released=released))

    def _fail_swap(self, reason: str, now: float, out: list[Command]) -> None:
        swap = self.swap
        assert swap is not None
        self.swap = None
        self.version += 1
        if self.resident == swap.target:
            # A swap to the resident itself (converging two members up) failed: it no longer
            # serves, and a resident left set would block adopting a member that does.
            self.resident = ""
        self._failed_until[swap.target] = now + self.limits.failure_backoff
        self._failed_message = reason
        retry = max(1, math.ceil(self.limits.failure_backoff))
        for rid, held in list(self.held.items()):
            if held.member == swap.target:
                del self.held[rid]
                out.append(Reject(rid, 503, "member_failed",
                                  f"model {held.member!r} failed to load: {reason}", retry,
                                  now - held.arrived))
        if self.obs[swap.target].replicas > 0 and not self._missing() \
                and not self._busy.get(swap.target, 0):
            # Free the slot for the next member. A Degraded pool, or a target that still has
            # requests in flight from before it broke (drain before unload holds even for a
            # failed member), leaves that to the next swap, whose stages drain and unload
            # every other member.
            out.append(Scale(swap.target, 0))
        out.append(Notice("SwapFailed", f"swap {swap.incumbent or '(none)'} -> {swap.target} "
                          f"failed: {reason}", source=swap.incumbent, target=swap.target,
                          duration=now - swap.started))

    # ---- helpers -------------------------------------------------------------------------

    def _admit(self, rid: int, member: str, held_for: float, out: list[Command]) -> None:
        self.in_flight[rid] = member
        self._busy[member] = self._busy.get(member, 0) + 1
        out.append(Admit(rid, member, held_for))

    def _routable(self, member: str) -> bool:
        return bool(member) and member == self.resident and self.obs[member].ready

    def _fairness_holds(self, member: str, now: float) -> bool:
        """True when ``member`` is the incumbent of a swap that has waited long enough."""
        swap = self.swap
        return swap is not None and swap.target != member and self._fairness_due(swap, now)

    def _fairness_due(self, swap: Swap, now: float) -> bool:
        """True once ``swap`` has waited its pool's fairness window (never when it is 0)."""
        window = self.spec.fairness_window
        return window > 0 and now - swap.started >= window

    def _missing(self) -> tuple[str, ...]:
        return tuple(m for m in self.spec.members if m in self.obs and not self.obs[m].exists)

    def _defer(self, reason: str, message: str, out: list[Command]) -> None:
        if self._deferred != (reason, message):
            self._deferred = (reason, message)
            self.version += 1
            out.append(Notice("SwapDeferred", message, target=self.swap.target if self.swap
                              else "", source=reason))

    def _clear_deferral(self) -> None:
        if self._deferred != ("", ""):
            self._deferred = ("", "")
            self.version += 1


# The transition table: which step runs for a swap in each stage.
STAGE_STEPS = {
    Stage.DRAIN: PoolMachine._drain,
    Stage.PROBE: PoolMachine._probe,
    Stage.UNLOAD: PoolMachine._unload,
    Stage.LOAD: PoolMachine._load,
}
