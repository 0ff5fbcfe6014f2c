"""The guards and actions of the transition table (``swap.py``) that both actuation modes
share, and those of own mode (this service drains, unloads and loads).

Rules of this file: it owns no state. Guards only read the machine (``pool.PoolReader``, and
the read-only rules of ``replicas``, ``reclaim`` and ``fairness``); actions change the swap
under way (``state.Swap``, the table's own record) and, through the machine's methods
(``pool.PoolWriter``), the resident, the failures and the replicas, and append commands.
Which edge uses which function, from which stage to which, is written only in
``swap.TRANSITIONS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from . import fairness, pacing, replicas
from .autoscaled import autoscaler
from .events import Command, Notice, ProbeIdle, Reject
from .model import PHASE_FAILED, Actuation
from .pool import PoolReader, PoolWriter
from .reclaim import reclaim_at, reclaim_target
from .wanting import asked_for, wanted
from .state import PolicyError, Stage, Swap

Out = list[Command]


def swap_of(m: PoolReader) -> Swap:
    """The swap under way (the edge's source stage guarantees there is one)."""
    assert m.swap is not None
    return m.swap


def others_busy(m: PoolReader) -> bool:
    return any(m.requests.busy(name) for name in m.others())


# ---- Idle ---------------------------------------------------------------------------------

def adoptable(m: PoolReader, now: float) -> bool:
    return not m.resident and any(m.obs[name].ready for name in m.spec.members)


def adopt(m: PoolWriter, now: float, out: Out) -> None:
    """With no resident, take a member that is already Ready (start-up, self-heal)."""
    ready = [name for name in m.spec.members if m.obs[name].ready]
    m.set_resident(m.hints.resident if m.hints.resident in ready else ready[0])
    m.pick_owner()


def held_for_serving(m: PoolReader, now: float) -> bool:
    # Normally none: a swap's completion releases its own. They appear when a spec change
    # cancels a swap while requests for the incumbent were held by fairness.
    # (A paced member's beyond its room wait for pacing.py's edge.)
    return any(m.routable(name) and pacing.room(m, name) > 0 for name in m.requests.held_by)


def release_serving(m: PoolWriter, now: float, out: Out) -> None:
    for name in list(m.requests.held_by):
        pacing.release(m, name, now, out)


def wants_a_member(m: PoolReader, now: float) -> bool:
    return bool(wanted(m))


def hint_left(m: PoolReader, now: float) -> bool:
    # Reached only when no swap started: a pending hint still here no longer applies.
    return bool(m.hints.pending)


def drop_hint(m: PoolWriter, now: float, out: Out) -> None:
    m.set_pending_hint("")  # consulted once, at start-up


def start(m: PoolWriter, now: float, out: Out) -> None:
    start_swap(m, wanted(m), now, "", out)


def start_swap(m: PoolWriter, target: str, now: float, why: str, out: Out) -> None:
    """Begin a swap to ``target`` ("": a release, the pool goes cold); ``why`` (said in the
    Notice) marks a reclaim."""
    drop_hint(m, now, out)
    m.forget_wish(target)
    m.begin_swap(Swap(target=target, incumbent=m.resident, started=now, reclaim=bool(why)))
    out.append(Notice("SwapStarted", f"swap {m.resident or '(none)'} -> {target or '(none)'} "
                      f"started{why}", source=m.resident, target=target))


def reclaim_due(m: PoolReader, now: float) -> bool:
    # Reached only when nothing is wanted: no request held or wished for another member.
    return now >= reclaim_at(m)


def reclaim(m: PoolWriter, now: float, out: Out) -> None:
    """swapPolicy reclaim: the idle resident gives the slot back to spec.default; reclaim-down:
    it releases the slot (a swap to "", which ends in Unloading: ``released``)."""
    start_swap(m, reclaim_target(m), now, f" ({m.spec.swap_policy}: {m.resident} idle for "
               f"{m.spec.reclaim_after:g}s)", out)


def reclaim_unwanted(m: PoolReader, now: float) -> bool:
    """A reclaim not yet unloading is moot once the resident serves, another member is
    wanted, or the pool left own mode (reclaim is then LLMKube's job)."""
    swap = swap_of(m)
    # (asked for, not wanted: a member scaled up behind our back during the reclaim is the
    # swap's own to scale down, no reason to give the reclaim up; the search's own-reclaim)
    return swap.reclaim and (m.actuation is not Actuation.OWN
                             or m.requests.busy(swap.incumbent) > 0
                             or asked_for(m) not in ("", swap.target))


def cancel_reclaim(m: PoolWriter, now: float, out: Out) -> None:
    swap = swap_of(m)
    m.end_swap()
    m.clear_deferral()
    out.append(Notice("SwapCancelled", f"reclaim {swap.incumbent} -> {swap.target} "
                      "cancelled: the slot is wanted again", source=swap.incumbent,
                      target=swap.target))


# ---- Draining and Probing -----------------------------------------------------------------

def drained(m: PoolReader, now: float) -> bool:
    """No other member busy here or on a live peer, past a refused probe's pause (while a
    probe is what decides), and the linger is over."""
    gated = m.limits.idle_gate or replicas.unsettled(m, now)
    paused = gated and now < swap_of(m).probe_retry_at
    return not paused and not others_busy(m) and now >= fairness.calm_at(m) \
        and replicas.peers_drained(m, m.others())


def drained_here_and_settled(m: PoolReader, now: float) -> bool:
    """Drained, and no lost peer may still stream from a serving member (else: probe it)."""
    return drained(m, now) and not (replicas.unsettled(m, now) and serving_others(m))


def serving_others(m: PoolReader) -> list[str]:
    # Only a serving member can be busy: one that crashed (CrashLoop, Failed) would never
    # answer the probe and would block the swap that heals the pool.
    return [name for name in m.others() if m.obs[name].ready]


def drained_and_gated(m: PoolReader, now: float) -> bool:
    # a lost peer's requests are unknown: the member's own idle signal settles them
    gated = m.limits.idle_gate or replicas.unsettled(m, now)
    return gated and drained(m, now) and bool(serving_others(m))


def probe(m: PoolWriter, now: float, out: Out) -> None:
    swap = swap_of(m)
    swap.stage, swap.probing, swap.refused = Stage.PROBE, set(serving_others(m)), None
    out.extend(ProbeIdle(name) for name in sorted(swap.probing))


def to_unload(m: PoolWriter, now: float, out: Out) -> None:
    swap_of(m).stage = Stage.UNLOAD


def busy_again(m: PoolReader, now: float) -> bool:
    return others_busy(m)


def back_to_drain(m: PoolWriter, now: float, out: Out) -> None:
    swap = swap_of(m)
    swap.stage, swap.probing, swap.refused = Stage.DRAIN, set(), None


def probe_refused(m: PoolReader, now: float) -> bool:
    return swap_of(m).refused is not None


def defer(m: PoolWriter, now: float, out: Out) -> None:
    swap = swap_of(m)
    member, idle = swap.refused or ("", None)
    reason = "PodsBusy" if idle is False else "IdleCheckFailed"
    text = (f"{member} reports requests in progress" if idle is False
            else f"cannot reach {member}'s runtime to confirm it is idle")
    m.defer(reason, f"swap to {swap.target} deferred: {text}", out)
    back_to_drain(m, now, out)
    swap.probe_retry_at = now + m.limits.probe_retry


def all_idle(m: PoolReader, now: float) -> bool:
    return not swap_of(m).probing


# ---- Unloading and Loading ----------------------------------------------------------------

def still_up(m: PoolReader, now: float) -> bool:
    swap = swap_of(m)
    others = m.others()
    return m.resident in others or any(
        _up_or_asked(m, name) and name not in swap.scaled_down for name in others)


def _up_or_asked(m: PoolReader, name: str) -> bool:
    # (our wish to scale it up may still stand: unload withdraws it too, landing.py)
    return m.obs[name].replicas > 0 or m.landing.standing(name)


def scale_down_others(m: PoolWriter, now: float, out: Out) -> None:
    swap = swap_of(m)
    for name in m.others():
        if m.requests.busy(name):
            raise PolicyError("a member with requests in flight is being unloaded")
        if _up_or_asked(m, name) and name not in swap.scaled_down:
            swap.scaled_down.add(name)
            m.scale(name, 0, out)
        if name == m.resident:
            m.set_resident("")


def _intruders(m: PoolReader) -> list[str]:
    """Members up that serve nothing and that no stage of ours asked for.

    Any member but the resident; the target only while another member still holds the GPU
    (later it is ours to load, and at start-up it may be a load we resume).
    """
    swap = swap_of(m)
    others_hold = not all(gone(m, name) for name in m.others())
    return [name for name in m.spec.members
            if name != m.resident and m.obs[name].replicas > 0 and not m.requests.busy(name)
            and name not in swap.scaled_down and (name != swap.target or others_hold)]


def intruder_up(m: PoolReader, now: float) -> bool:
    """A member scaled up behind our back while the swap waits (it would share the GPU)."""
    return bool(_intruders(m))


def scale_down_intruders(m: PoolWriter, now: float, out: Out) -> None:
    """Scale every intruder back to 0 now, not at the unload stage."""
    swap = swap_of(m)
    for name in _intruders(m):
        swap.scaled_down.add(name)
        m.scale(name, 0, out)


def gone(m: PoolReader, name: str) -> bool:
    """``name`` holds no GPU, and no write of ours may still bring it up (landing.py)."""
    # Wait for pods to be gone, not for phase Stopped: a terminating pod still holds memory.
    return m.obs[name].unloaded and not m.landing.may_land(name, m.now)


def others_gone(m: PoolReader, now: float) -> bool:
    return all(gone(m, name) for name in m.others())


def release_wanted(m: PoolReader, now: float) -> bool:
    """A release already unloading, and a request now wants a member: the slot goes to it."""
    return not swap_of(m).target and bool(wanted(m))


def retarget(m: PoolWriter, now: float, out: Out) -> None:
    """The release becomes a swap to the wanted member: what is unloaded stays so, and the
    member loads once the rest is gone (its own terminating pod holds no other member off)."""
    swap = swap_of(m)
    swap.target, swap.reclaim = wanted(m), False
    m.forget_wish(swap.target)
    out.append(Notice("SwapStarted", f"swap {swap.incumbent or '(none)'} -> {swap.target} "
                      "started (the release under way gave way to it)", source=swap.incumbent,
                      target=swap.target))


def released(m: PoolReader, now: float) -> bool:
    """A release (reclaim-down: no target) whose members are all gone: nothing to load."""
    return not swap_of(m).target and others_gone(m, now)


def go_cold(m: PoolWriter, now: float, out: Out) -> None:
    """The release is done: no resident. A held request starts the next swap from cold."""
    swap = swap_of(m)
    m.end_swap()
    m.clear_deferral()
    m.set_resident("")
    out.append(Notice("Reclaimed", f"slot released by idle {swap.incumbent or '(none)'}: the "
                      "pool is cold until a request loads a member", source=swap.incumbent,
                      target="", duration=now - swap.started))


def load(m: PoolWriter, now: float, out: Out) -> None:
    swap = swap_of(m)
    m.clear_deferral()
    target = m.obs[swap.target]
    swap.stage, swap.load_started, swap.phase_at_load = Stage.LOAD, now, target.phase
    swap.asked_up_at = now
    if target.replicas < 1 or swap.target in swap.scaled_down:
        # (an early scale-up of the target by someone else was undone: ask again)
        swap.scaled_down.discard(swap.target)
        m.scale(swap.target, 1, out)
    else:
        swap.saw_progress = True  # already asked up: its phase is current


def others_back(m: PoolReader, now: float) -> bool:
    """While loading, another member holds the GPU again (scaled up behind our back): unload
    before load holds for it too, the target included (it waits at 0 until the slot is free)."""
    return not others_gone(m, now)


def reask_at(m: PoolReader) -> float:
    """When a loading target still seen at 0 replicas is asked for again (inf: it is not)."""
    swap = swap_of(m)
    if m.obs[swap.target].replicas or m.missing():  # (a Degraded pool changes no replicas)
        return math.inf
    return swap.asked_up_at + m.limits.activation_grace


def target_at_zero(m: PoolReader, now: float) -> bool:
    """The loading target has shown no replica for the grace since we asked: our patch is
    slow, or someone scaled it back (kubectl, a GitOps sync; a watch may show only the 0).
    The slot is free and ours, so it would otherwise wait for a load nobody runs."""
    return now >= reask_at(m)


def scale_up_again(m: PoolWriter, now: float, out: Out) -> None:
    swap = swap_of(m)
    swap.asked_up_at = now
    m.scale(swap.target, 1, out)


def target_ready(m: PoolReader, now: float) -> bool:
    return m.obs[swap_of(m).target].ready


def complete(m: PoolWriter, now: float, out: Out) -> None:
    swap = swap_of(m)
    m.end_swap()
    m.set_resident(swap.target, since=now)  # (replicas.peers_release_first counts from now)
    duration = now - swap.started
    m.history.record(swap.incumbent, swap.target, duration)
    m.clear_failure(swap.target)
    # Only if the target may be routed to now: a replica past its admission Lease, or one
    # following a leader (or LLMKube) that already announced the next swap, keeps them held;
    # Idle's release edge lets them go once it may. Paced: up to its capacity (pacing.py).
    via = f"{swap.incumbent or '(none)'}->{swap.target}"  # (the answer's x-modelpool-swap)
    released = pacing.release(m, swap.target, now, out, via)
    out.append(Notice("SwapCompleted", f"swap {swap.incumbent or '(none)'} -> "
                      f"{swap.target} completed in {duration:.1f}s, {released} released",
                      source=swap.incumbent, target=swap.target, duration=duration,
                      released=released))
    if swap.reclaim:
        out.append(Notice("Reclaimed", f"slot reclaimed for {swap.target} from idle "
                          f"{swap.incumbent or '(none)'}", source=swap.incumbent,
                          target=swap.target, duration=duration))


def target_failed(m: PoolReader, now: float) -> bool:
    swap = swap_of(m)
    return m.obs[swap.target].phase == PHASE_FAILED and swap.saw_progress


def timed_out(m: PoolReader, now: float) -> bool:
    # Same arithmetic as next_deadline(): a Tick at that deadline must fire the timeout.
    return now >= swap_of(m).load_started + m.limits.swap_timeout


def fail(reason: Callable[[PoolReader], str]) -> Callable[[PoolWriter, float, Out], None]:
    """The action that fails the swap, with ``reason`` as the operators' explanation."""
    def action(m: PoolWriter, now: float, out: Out) -> None:
        fail_swap(m, reason(m), now, out)
    return action


def fail_swap(m: PoolWriter, reason: str, now: float, out: Out) -> None:
    swap = swap_of(m)
    m.end_swap()
    if m.resident == swap.target:
        # A swap to the resident itself (converging two members up) failed: it no longer
        # serves, and a resident left set would block adopting a member that does.
        m.set_resident("")
    m.record_failure(swap.target, now + m.limits.failure_backoff, reason)
    retry = max(1, math.ceil(m.limits.failure_backoff))
    for rid, held in m.requests.held_for(swap.target):
        m.requests.unhold(rid)
        out.append(Reject(rid, 503, "member_failed",
                          f"model {held.member!r} failed to load: {reason}", retry,
                          now - held.arrived))
    if m.actuation is Actuation.OWN and m.obs[swap.target].replicas > 0 and not m.missing() \
            and not m.requests.busy(swap.target):
        # Free the slot for the next member. A Degraded pool, or a target that still has
        # requests in flight from before it broke (drain before unload holds even for a
        # failed member), leaves that to the next swap, whose stages drain and unload
        # every other member.
        m.scale(swap.target, 0, out)
    out.append(Notice("SwapFailed", f"swap {swap.incumbent or '(none)'} -> {swap.target} "
                      f"failed: {reason}", source=swap.incumbent, target=swap.target,
                      duration=now - swap.started))


# ---- any stage ----------------------------------------------------------------------------

def target_left(m: PoolReader, now: float) -> bool:
    """The target left the spec, or an autoscaler took it (autoscaled.py: never loaded); a
    release has no target to lose."""
    target = swap_of(m).target
    return bool(target) and (target not in m.spec.members or bool(autoscaler(m, target)))


def cancel(m: PoolWriter, now: float, out: Out) -> None:
    target = swap_of(m).target
    m.end_swap()  # nothing left to load; its held requests were rejected (spec, autoscaler)
    if m.actuation is Actuation.OWN and m.landing.standing(target) and not m.missing() \
            and not m.requests.busy(target) and not autoscaler(m, target):
        m.scale(target, 0, out)  # withdraw our wish: it would bring a removed member up


