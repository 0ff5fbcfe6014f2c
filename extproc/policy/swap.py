"""The transition table of a pool's machine: every edge from one stage to the next.

Rules of this file
------------------
* ``TRANSITIONS`` is the whole graph. Each row is an edge: the stage it leaves, the guard
  that must hold, the stage it enters, the action that goes with it, and the gate saying
  what the pool must look like for the edge to be considered at all. Nothing outside this
  file changes ``Swap.stage`` or starts, completes, fails or cancels a swap.
* Guards only read. Actions change the machine and append commands.
* After every event, ``advance`` follows the first edge of the current stage whose gate and
  guard hold, again and again, until none does. A self-loop (a stage to itself) is allowed
  when its action makes its own guard false, which ``advance`` checks by counting passes.

Gates
-----
ALWAYS   the edge needs no observation: time and spec only (timeout, cancellation).
SEEN     every member has been observed; the edge makes no replica change, so it also runs
         while the pool is Degraded (a Ready target still takes the slot).
HEALTHY  every member observed and none missing: the edge may change replicas.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from .events import Command, Notice, ProbeIdle, Reject, Scale
from .model import PHASE_FAILED
from .state import PolicyError, Stage, Swap

if TYPE_CHECKING:
    from .machine import PoolMachine

Out = list[Command]


class Gate(Enum):
    """What the pool must look like for an edge to be considered (see the module header)."""

    ALWAYS = 0
    SEEN = 1
    HEALTHY = 2


@dataclass(frozen=True, slots=True)
class Edge:
    """One transition: ``source --guard--> target``, doing ``action`` on the way."""

    source: Stage
    guard: Callable[[PoolMachine, float], bool]
    target: Stage
    action: Callable[[PoolMachine, float, Out], None]
    gate: Gate


def advance(m: PoolMachine, now: float, out: Out) -> None:
    """Follow edges from the current stage until none applies (state-triggered)."""
    seen = all(name in m.obs for name in m.spec.members)
    healthy = seen and not m.missing()
    allowed = {Gate.ALWAYS: True, Gate.SEEN: seen, Gate.HEALTHY: healthy}
    for _ in range(4 * len(m.spec.members) + 16):  # each pass follows one edge
        stage = m.stage
        edge = next((e for e in _BY_SOURCE[stage] if allowed[e.gate] and e.guard(m, now)), None)
        if edge is None:
            return
        edge.action(m, now, out)
        if m.stage is not edge.target:
            raise PolicyError(f"edge {stage.value} -> {edge.target.value} ended in "
                              f"{m.stage.value}")
    raise PolicyError("swap engine did not settle")  # a bug: transitions must converge


def _swap(m: PoolMachine) -> Swap:
    assert m.swap is not None
    return m.swap


def _others_busy(m: PoolMachine) -> bool:
    return any(m.requests.busy(name) for name in m.others())


# ---- Idle ---------------------------------------------------------------------------------

def _adoptable(m: PoolMachine, now: float) -> bool:
    return not m.resident and any(m.obs[name].ready for name in m.spec.members)


def _adopt(m: PoolMachine, now: float, out: Out) -> None:
    """With no resident, take a member that is already Ready (start-up, self-heal)."""
    ready = [name for name in m.spec.members if m.obs[name].ready]
    m.resident = m.hints.resident if m.hints.resident in ready else ready[0]
    m.owner_picked = True
    m.version += 1


def _held_for_serving(m: PoolMachine, now: float) -> bool:
    # Normally none: a swap's completion releases its own. They appear when a spec change
    # cancels a swap while requests for the incumbent were held by fairness.
    return any(m.routable(held.member) for held in m.requests.held.values())


def _release_serving(m: PoolMachine, now: float, out: Out) -> None:
    for rid, held in list(m.requests.held.items()):
        if m.routable(held.member):
            m.requests.unhold(rid)
            m.admit(rid, held.member, now - held.arrived, out)


def wanted(m: PoolMachine) -> str:
    """The member the slot should go to next, or "" to stay put."""
    hint = m.hints.pending
    if hint in m.spec.members and not m.routable(hint):
        return hint  # resume the swap a previous process (or leader) started
    for held in m.requests.held.values():  # oldest first: insertion order
        if not m.routable(held.member):
            return held.member
    scaled = [name for name in m.spec.members if m.obs[name].replicas > 0]
    if m.routable(m.resident) and len(scaled) > 1:
        return m.resident  # a second member was scaled up behind our back: undo it
    if not m.resident and not m.owner_picked and m.spec.default \
            and all(o.unloaded for o in m.obs.values()):
        return m.spec.default  # cold pool: warm the default member
    return ""


def _wants_a_member(m: PoolMachine, now: float) -> bool:
    return bool(wanted(m))


def _hint_left(m: PoolMachine, now: float) -> bool:
    # Reached only when no swap started: a pending hint still here no longer applies.
    return bool(m.hints.pending)


def _drop_hint(m: PoolMachine, now: float, out: Out) -> None:
    m.hints = replace(m.hints, pending="")  # consulted once, at start-up


def _start(m: PoolMachine, now: float, out: Out) -> None:
    target = wanted(m)
    _drop_hint(m, now, out)
    m.owner_picked = True
    m.swap = Swap(target=target, incumbent=m.resident, started=now)
    m.version += 1
    out.append(Notice("SwapStarted", f"swap {m.resident or '(none)'} -> {target} started",
                      source=m.resident, target=target))


# ---- Draining and Probing -----------------------------------------------------------------

def _drained(m: PoolMachine, now: float) -> bool:
    """No other member busy, past a refused probe's pause, and the linger is over."""
    return now >= _swap(m).probe_retry_at and not _others_busy(m) and now >= m.calm_at()


def _serving_others(m: PoolMachine) -> list[str]:
    # Only a serving member can be busy: one that crashed (CrashLoop, Failed) would never
    # answer the probe and would block the swap that heals the pool.
    return [name for name in m.others() if m.obs[name].ready]


def _drained_and_gated(m: PoolMachine, now: float) -> bool:
    return m.limits.idle_gate and _drained(m, now) and bool(_serving_others(m))


def _probe(m: PoolMachine, now: float, out: Out) -> None:
    swap = _swap(m)
    swap.stage, swap.probing, swap.refused = Stage.PROBE, set(_serving_others(m)), None
    out.extend(ProbeIdle(name) for name in sorted(swap.probing))


def _to_unload(m: PoolMachine, now: float, out: Out) -> None:
    _swap(m).stage = Stage.UNLOAD


def _busy_again(m: PoolMachine, now: float) -> bool:
    return _others_busy(m)


def _back_to_drain(m: PoolMachine, now: float, out: Out) -> None:
    swap = _swap(m)
    swap.stage, swap.probing, swap.refused = Stage.DRAIN, set(), None


def _probe_refused(m: PoolMachine, now: float) -> bool:
    return _swap(m).refused is not None


def _defer(m: PoolMachine, now: float, out: Out) -> None:
    swap = _swap(m)
    member, idle = swap.refused or ("", None)
    reason = "PodsBusy" if idle is False else "IdleCheckFailed"
    text = (f"{member} reports requests in progress" if idle is False
            else f"cannot reach {member}'s runtime to confirm it is idle")
    m.defer(reason, f"swap to {swap.target} deferred: {text}", out)
    _back_to_drain(m, now, out)
    swap.probe_retry_at = now + m.limits.probe_retry


def _all_idle(m: PoolMachine, now: float) -> bool:
    return not _swap(m).probing


# ---- Unloading and Loading ----------------------------------------------------------------

def _still_up(m: PoolMachine, now: float) -> bool:
    swap = _swap(m)
    others = m.others()
    return m.resident in others or any(
        m.obs[name].replicas > 0 and name not in swap.scaled_down for name in others)


def _scale_down_others(m: PoolMachine, now: float, out: Out) -> None:
    swap = _swap(m)
    for name in m.others():
        if m.requests.busy(name):
            raise PolicyError("a member with requests in flight is being unloaded")
        if m.obs[name].replicas > 0 and name not in swap.scaled_down:
            swap.scaled_down.add(name)
            out.append(Scale(name, 0))
        if name == m.resident:
            m.resident = ""
            m.version += 1


def _others_gone(m: PoolMachine, now: float) -> bool:
    # Wait for pods to be gone, not for phase Stopped: a terminating pod still holds memory.
    return all(m.obs[name].unloaded for name in m.others())


def _load(m: PoolMachine, now: float, out: Out) -> None:
    swap = _swap(m)
    m.clear_deferral()
    target = m.obs[swap.target]
    swap.stage, swap.load_started, swap.phase_at_load = Stage.LOAD, now, target.phase
    m.version += 1
    if target.replicas < 1:
        out.append(Scale(swap.target, 1))
    else:
        swap.saw_progress = True  # already asked up: its phase is current


def _target_ready(m: PoolMachine, now: float) -> bool:
    return m.obs[_swap(m).target].ready


def _complete(m: PoolMachine, now: float, out: Out) -> None:
    swap = _swap(m)
    m.swap = None
    m.resident = swap.target
    m.version += 1
    duration = now - swap.started
    m.history.record(duration)
    m.failed_until.pop(swap.target, None)
    released = 0
    for rid, held in m.requests.held_for(swap.target):
        m.requests.unhold(rid)
        m.admit(rid, held.member, now - held.arrived, out)
        released += 1
    out.append(Notice("SwapCompleted", f"swap {swap.incumbent or '(none)'} -> "
                      f"{swap.target} completed in {duration:.1f}s, {released} released",
                      source=swap.incumbent, target=swap.target, duration=duration,
                      released=released))


def _target_failed(m: PoolMachine, now: float) -> bool:
    swap = _swap(m)
    return m.obs[swap.target].phase == PHASE_FAILED and swap.saw_progress


def _timed_out(m: PoolMachine, now: float) -> bool:
    # Same arithmetic as next_deadline(): a Tick at that deadline must fire the timeout.
    return now >= _swap(m).load_started + m.limits.swap_timeout


def _fail(reason: Callable[[PoolMachine], str]) -> Callable[[PoolMachine, float, Out], None]:
    """The action that fails the swap, with ``reason`` as the operators' explanation."""
    def action(m: PoolMachine, now: float, out: Out) -> None:
        _fail_swap(m, reason(m), now, out)
    return action


def _fail_swap(m: PoolMachine, reason: str, now: float, out: Out) -> None:
    swap = _swap(m)
    m.swap = None
    m.version += 1
    if m.resident == swap.target:
        # A swap to the resident itself (converging two members up) failed: it no longer
        # serves, and a resident left set would block adopting a member that does.
        m.resident = ""
    m.failed_until[swap.target] = now + m.limits.failure_backoff
    m.failed_message = reason
    retry = max(1, math.ceil(m.limits.failure_backoff))
    for rid, held in m.requests.held_for(swap.target):
        m.requests.unhold(rid)
        out.append(Reject(rid, 503, "member_failed",
                          f"model {held.member!r} failed to load: {reason}", retry,
                          now - held.arrived))
    if m.obs[swap.target].replicas > 0 and not m.missing() and not m.requests.busy(swap.target):
        # Free the slot for the next member. A Degraded pool, or a target that still has
        # requests in flight from before it broke (drain before unload holds even for a
        # failed member), leaves that to the next swap, whose stages drain and unload
        # every other member.
        out.append(Scale(swap.target, 0))
    out.append(Notice("SwapFailed", f"swap {swap.incumbent or '(none)'} -> {swap.target} "
                      f"failed: {reason}", source=swap.incumbent, target=swap.target,
                      duration=now - swap.started))


# ---- any stage ----------------------------------------------------------------------------

def _target_left(m: PoolMachine, now: float) -> bool:
    return _swap(m).target not in m.spec.members


def _cancel(m: PoolMachine, now: float, out: Out) -> None:
    m.swap = None  # nothing left to load; its held requests were rejected with the spec
    m.version += 1


_SWAPPING = (Stage.DRAIN, Stage.PROBE, Stage.UNLOAD, Stage.LOAD)
_I, _D, _P, _U, _L = Stage.IDLE, Stage.DRAIN, Stage.PROBE, Stage.UNLOAD, Stage.LOAD
_A, _S, _H = Gate.ALWAYS, Gate.SEEN, Gate.HEALTHY

# The whole graph, tried in this order within each source stage (first match wins).
TRANSITIONS: tuple[Edge, ...] = (
    *(Edge(s, _target_left, _I, _cancel, _A) for s in _SWAPPING),
    Edge(_L, _timed_out, _I, _fail(lambda m: f"{_swap(m).target} not Ready after "
                                   f"{m.limits.swap_timeout:g}s"), _A),
    Edge(_L, _target_ready, _I, _complete, _S),
    Edge(_L, _target_failed, _I, _fail(lambda m: f"{_swap(m).target} reported phase Failed"),
         _H),
    Edge(_I, _held_for_serving, _I, _release_serving, _S),
    Edge(_I, _adoptable, _I, _adopt, _H),
    Edge(_I, _wants_a_member, _D, _start, _H),
    Edge(_I, _hint_left, _I, _drop_hint, _H),
    Edge(_D, _drained_and_gated, _P, _probe, _H),
    Edge(_D, _drained, _U, _to_unload, _H),
    Edge(_P, _busy_again, _D, _back_to_drain, _H),
    Edge(_P, _probe_refused, _D, _defer, _H),
    Edge(_P, _all_idle, _U, _to_unload, _H),
    Edge(_U, _still_up, _U, _scale_down_others, _H),
    Edge(_U, _others_gone, _L, _load, _H),
)

_BY_SOURCE: dict[Stage, tuple[Edge, ...]] = {
    stage: tuple(e for e in TRANSITIONS if e.source is stage) for stage in Stage}
