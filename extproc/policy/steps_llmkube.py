"""The guards and actions of llmkube mode: this service is the pool's activator.

LLMKube's ModelPoolReconciler owns member replicas and the pool's status; it drains, probes,
unloads and loads. What is left to us is what its router-proxy does, done better: hold the
requests, trigger a swap only once no request of ours is in flight on the incumbent (the
target's ``spec.replicas`` 0 -> 1, nothing else), hold every new request for the incumbent
from the moment any swap is under way, and release the held requests when the target is
Ready *and* ``status.residentMember`` names it. Which stage each function leads from and to
is written in ``swap.TRANSITIONS``.

A trigger can be lost. LLMKube's reconciler sometimes decides from a cached pool that does not
yet hold its own ``pendingMember`` write, falls back to the resident and puts the target back
at 0 (docs/guarantees.md, "Never wedged"); an admin can also scale the target back. Then the
cluster shows no trace of the swap: the target at 0 replicas, neither pending nor resident.
Once that has lasted ``activation_grace`` (doubling per loss, so a reconciler that is merely
slow to write ``pendingMember`` is not raced), the swap goes back to Draining and triggers
again; after ``activation_retries`` losses it is given up, its held requests are told so, and
the incumbent serves again. The watchdog (``watchdog.py``) watches Triggered too, and while a
trigger is stalled the resident LLMKube still names serves its own requests.

Rules of this file: it owns no state but the swap's record of lost triggers (``Swap.lost``,
``lost_since``, kept by ``track_activation`` after every event). As in ``steps.py``, guards
read the machine (``pool.PoolReader``) and actions change the swap and, through the
machine's methods (``pool.PoolWriter``), the rest.
"""

from __future__ import annotations

import math

from .events import Command, Notice, Reject, Trigger
from .model import PHASE_FAILED, Actuation
from .pool import PoolReader, PoolWriter
from .state import Stage, Swap
from .steps import drained, swap_of
from .wanting import llmkube_blocked

Out = list[Command]


def incoming(m: PoolReader) -> str:
    """The member LLMKube is bringing in, as the cluster shows it ("" if none).

    Our own trigger, ``status.pendingMember``, or a member that is not resident but has
    ``spec.replicas >= 1`` (someone's trigger that the reconciler has not recorded yet); as a
    follower, the leader's announcement or its status only.
    """
    swap = m.swap
    if swap is not None and swap.stage is Stage.TRIGGERED and stalled_trigger_frees(m):
        return ""  # nothing of it in the cluster: the resident serves meanwhile
    if swap is not None and swap.stage is Stage.TRIGGERED:
        return swap.target
    announced = m.drain[1]  # follow mode: the leader's drain announcement comes first
    if m.actuation is Actuation.FOLLOW and announced in m.spec.members and announced != m.resident:
        return announced
    # (a follower follows its leader's word only: a member someone scaled up behind the
    # leader's back is the leader's to undo, and it announces that swap like any other)
    follower = m.actuation is Actuation.FOLLOW
    # A member whose load just failed is not coming in (LLMKube gives way to the next request).
    def coming(name: str) -> bool:
        obs = m.obs.get(name)
        return name in m.spec.members and name != m.resident and name not in m.failed_until \
            and (obs is None or obs.phase != PHASE_FAILED)

    if m.status.pending and coming(m.status.pending):
        return m.status.pending
    if follower:
        return ""
    return next((name for name in m.spec.members if coming(name) and name in m.obs
                 and m.obs[name].replicas > 0), "")


def someone_swaps(m: PoolReader, now: float) -> bool:
    """A swap we did not start is under way (seen in the status or in replicas)."""
    return bool(incoming(m))


def follow_swap(m: PoolWriter, now: float, out: Out) -> None:
    """Follow it: the incumbent's new requests are held from now, held ones released after."""
    target = incoming(m)
    m.begin_swap(Swap(target=target, incumbent=m.resident, started=now, stage=Stage.TRIGGERED,
                      load_started=now, followed_epoch=m.drain[0]))
    by = "LLMKube" if m.actuation is Actuation.LLMKUBE else "the replica leading the pool"
    out.append(Notice("SwapStarted", f"swap {m.resident or '(none)'} -> {target} started "
                      f"(by {by})", source=m.resident, target=target))


def leader_dropped(m: PoolReader, now: float) -> bool:
    """Follow mode: the leader gave the swap up (a cancelled reclaim, a change of hands): a
    newer announcement no longer names its target, nor does the status."""
    swap = swap_of(m)
    return m.drain[0] > swap.followed_epoch and m.drain[1] != swap.target \
        and m.status.pending != swap.target and m.status.resident != swap.target


def stop_following(m: PoolWriter, now: float, out: Out) -> None:
    """Back to Idle: the incumbent's held requests pass again once it may be routed to."""
    swap = swap_of(m)
    m.end_swap()
    out.append(Notice("SwapCancelled", f"swap {swap.incumbent or '(none)'} -> {swap.target} "
                      "given up by the replica leading the pool", source=swap.incumbent,
                      target=swap.target))


def drained_here(m: PoolReader, now: float) -> bool:
    """No request of ours is in flight elsewhere, the linger is over, and no other member is
    coming in (a second trigger while LLMKube swaps would be read as a competing owner)."""
    return drained(m, now) and incoming(m) in ("", swap_of(m).target)


def trigger(m: PoolWriter, now: float, out: Out) -> None:
    """Patch the target's replicas 0 -> 1 (unless someone already did) and wait for LLMKube."""
    swap = swap_of(m)
    target = m.obs[swap.target]
    swap.stage, swap.load_started, swap.phase_at_load = Stage.TRIGGERED, now, target.phase
    if target.replicas < 1:
        # it may land after the swap is given up: the member counts as possibly up (landing.py)
        m.landing.asked(swap.target, 1, now, m.limits.write_landing, standing=False)
        out.append(Trigger(swap.target))
    else:
        swap.saw_progress = True  # already asked up: its phase is current


def target_resident(m: PoolReader, now: float) -> bool:
    """The target is Ready and LLMKube's status names it resident: release its requests."""
    swap = swap_of(m)
    return m.status.resident == swap.target and m.obs[swap.target].ready


# ---- a trigger LLMKube lost (see the module header) ------------------------------------------

def activation_gone(m: PoolReader) -> bool:
    """Our trigger left no trace: the target at 0 replicas, neither pending nor resident."""
    swap = m.swap
    if m.actuation is not Actuation.LLMKUBE or swap is None or swap.stage is not Stage.TRIGGERED:
        return False
    target = m.obs.get(swap.target)
    return target is not None and target.replicas == 0 \
        and swap.target not in (m.status.pending, m.status.resident)


def track_activation(m: PoolReader, now: float) -> None:
    """After every event: since when the trigger under way has left no trace (None: it has)."""
    swap = m.swap
    if swap is not None and swap.stage is Stage.TRIGGERED:
        swap.lost_since = (swap.lost_since if swap.lost_since is not None else now) \
            if activation_gone(m) else None


def lost_at(m: PoolReader) -> float:
    """When the trigger under way counts as lost (inf: it shows in the cluster)."""
    swap = m.swap
    if swap is None or swap.lost_since is None or not activation_gone(m):
        return math.inf
    return swap.lost_since + m.limits.activation_grace * 2.0 ** swap.lost


def _awaited(m: PoolReader) -> bool:
    target = swap_of(m).target
    return bool(m.requests.held_by.get(target)) or target in m.wishes


def activation_unwanted(m: PoolReader, now: float) -> bool:
    """A swap with no trace left that nobody here waits for (one LLMKube started and then
    gave up for a newer request, or our own whose requests left): nothing to trigger again."""
    return now >= lost_at(m) and not _awaited(m)


def drop_lost(m: PoolWriter, now: float, out: Out) -> None:
    """Back to Idle, following the cluster again."""
    swap = swap_of(m)
    m.end_swap()
    out.append(Notice("SwapCancelled", f"swap {swap.incumbent or '(none)'} -> {swap.target} "
                      f"left no trace ({swap.target} at 0 replicas, {_where(m)}) and no "
                      "request waits for it", source=swap.incumbent, target=swap.target))


def activation_lost(m: PoolReader, now: float) -> bool:
    """The trigger was dropped and may be sent again."""
    return now >= lost_at(m) and swap_of(m).lost < m.limits.activation_retries


def activation_abandoned(m: PoolReader, now: float) -> bool:
    """The trigger was dropped once more than ``activation_retries`` allows."""
    return now >= lost_at(m) and swap_of(m).lost >= m.limits.activation_retries


def _where(m: PoolReader) -> str:
    return f"its status stays on {m.status.resident or 'no member'}" + \
        (f", pending {m.status.pending}" if m.status.pending else ", nothing pending")


def retrigger(m: PoolWriter, now: float, out: Out) -> None:
    """Back to Draining: our own requests drain again (if any came in) and the trigger repeats."""
    swap = swap_of(m)
    swap.lost += 1
    swap.stage, swap.lost_since = Stage.DRAIN, None
    out.append(Notice("ActivationLost", f"LLMKube dropped the activation of {swap.target}: it "
                      f"is back at 0 replicas and {_where(m)}; triggering again "
                      f"({swap.lost}/{m.limits.activation_retries})",
                      source=swap.incumbent, target=swap.target))


def abandon(m: PoolWriter, now: float, out: Out) -> None:
    """Give the swap up: its held requests hear why, the incumbent's pass again."""
    swap = swap_of(m)
    m.end_swap()
    reason = (f"LLMKube's ModelPool reconciler dropped the activation of {swap.target} "
              f"{swap.lost + 1} times ({_where(m)})")
    for rid, held in m.requests.held_for(swap.target):
        m.requests.unhold(rid)
        out.append(Reject(rid, 503, "activation_lost", f"model {held.member!r} was not loaded: "
                          f"{reason}; retry after Retry-After", m.retry_after(),
                          now - held.arrived))
    out.append(Notice("ActivationLost", f"{reason}; the swap is given up",
                      source=swap.incumbent, target=swap.target))
    out.append(Notice("SwapFailed", f"swap {swap.incumbent or '(none)'} -> {swap.target} "
                      f"given up: {reason}", source=swap.incumbent, target=swap.target,
                      duration=now - swap.started))


def stalled_trigger_frees(m: PoolReader) -> bool:
    """A trigger the watchdog marked stalled whose target has no pod: LLMKube is not moving,
    so the resident it names keeps serving (its idle probe still guards the unload)."""
    swap = m.swap
    target = m.obs.get(swap.target) if swap is not None else None
    return swap is not None and swap.stage is Stage.TRIGGERED and bool(swap.stalled) \
        and m.actuation is Actuation.LLMKUBE and target is not None and target.pods == 0


# ---- a pool LLMKube cannot move --------------------------------------------------------------

blocker = llmkube_blocked  # (in wanting.py: wanted() consults it too)


def blocked_reject(m: PoolReader, rid: int, member: str, held_for: float) -> Reject:
    """The answer for a request no swap can serve while LLMKube keeps a failed member pending."""
    stuck, key = blocker(m), m.spec.key
    return Reject(rid, 503, "pool_blocked", f"model {member!r} cannot be loaded now: LLMKube's "
                  f"reconciler keeps {stuck!r}, which failed to load, as pool {key}'s pending "
                  f"member and loads nothing else until it is fixed (kubectl describe isvc "
                  f"{stuck} -n {key.namespace}) or removed from the pool",
                  m.limits.retry_after_max, held_for)


def reject_blocked(m: PoolWriter, now: float, out: Out) -> None:
    """After every event: held requests that only a blocked pool could serve are told why."""
    stuck = blocker(m)
    if not stuck:
        return
    for rid, held in list(m.requests.held.items()):
        if held.member != stuck and not m.routable(held.member):
            m.requests.unhold(rid)
            out.append(blocked_reject(m, rid, held.member, now - held.arrived))
