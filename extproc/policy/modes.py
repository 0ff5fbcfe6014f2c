"""Who actuates a pool, and how the machine changes hands: the status LLMKube writes, the
auto mode's choice, and the fight detector of own mode.

Rules of this file: it only sets ``PoolMachine.actuation`` and what follows from a change of
hands (the swap's stage, held requests): the one change of stage made outside
``swap.TRANSITIONS``, because it is not an edge of either mode but the move from one mode's
graph to the other's. The machine does it between events, never inside an edge.

Hands-off is a spell, not a verdict. Own mode stops actuating a pool that another writer
fights over (its status rewritten, or a member scaled up again FIGHT_SCALE_DOWNS times), but
an operator trying ``kubectl scale`` a few times is not a controller: once no foreign write
has been seen for ``hands_off_quiet`` (doubling for each new spell within FIGHT_WINDOW of the
last, up to 16x), the pool resumes, and a new value of the annotation RESUME_ANNOTATION ends
the spell at once. Meanwhile every member the cluster shows Ready is routed to, and the rest
get 503 ``pool_conflict`` saying when and how the pool resumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .events import Command, Notice, Reject, Trigger
from .model import Actuation, PoolStatus
from .state import Stage

if TYPE_CHECKING:
    from .machine import PoolMachine

Out = list[Command]

# Own mode: a member we scale down this many times within FIGHT_WINDOW seconds is being
# scaled up again by someone else on purpose (a GitOps controller re-applying replicas, a
# second operator), not by a one-off `kubectl scale`: we stop actuating instead of flapping.
FIGHT_SCALE_DOWNS = 3
FIGHT_WINDOW = 600.0
CONFLICT_CODE = "pool_conflict"
RESUME_ANNOTATION = "modelpool.inference.llmkube.dev/resume"
MAX_SPELL_FACTOR = 16


@dataclass(slots=True)
class HandsOff:
    """Own mode's hands-off spells: how many in a row, the last foreign write, how to end it."""

    spells: int = 0
    quiet_since: float = -math.inf  # the last foreign write seen during the spell
    ended: float = -math.inf  # when the last spell ended
    token: str = ""  # the resume annotation's value when the spell began


def quiet_needed(m: PoolMachine) -> float:
    """How long the spell under way lasts without a foreign write."""
    return m.limits.hands_off_quiet * min(MAX_SPELL_FACTOR, 2 ** max(0, m.hands_off.spells - 1))


def resume_at(m: PoolMachine) -> float:
    """When the hands-off spell under way ends by itself (inf: none under way)."""
    if m.actuation is not Actuation.HANDS_OFF:
        return math.inf
    return m.hands_off.quiet_since + quiet_needed(m)


def foreign_write(m: PoolMachine) -> None:
    """A write that was not ours (a replica change, a foreign status) restarts the quiet clock."""
    if m.actuation is Actuation.HANDS_OFF:
        m.hands_off.quiet_since = m.now


def resume(m: PoolMachine, out: Out) -> bool:
    """End the hands-off spell when it has been quiet long enough or the annotation says so."""
    if m.actuation is not Actuation.HANDS_OFF:
        return False
    spell = m.hands_off
    if m.spec.resume != spell.token:
        why = f"annotation {RESUME_ANNOTATION} changed"
    elif m.now >= resume_at(m):
        why = f"no foreign write for {quiet_needed(m):g}s"
    else:
        return False
    spell.ended = m.now
    m.fight = ""
    m.undone.clear()
    m.asked_down.clear()
    switch(m, Actuation.OWN, f"hands-off over ({why}); actuating again", out)
    return True


def resume_hint(m: PoolMachine) -> str:
    """How the spell ends, for the Event that announces it and the answers it gives."""
    key = m.spec.key
    return (f"this router routes only to members the cluster shows Ready and resumes "
            f"actuating after {quiet_needed(m):g}s without a foreign write, or at once with: "
            f"kubectl annotate mpool {key.name} -n {key.namespace} "
            f"{RESUME_ANNOTATION}=\"$(date +%s)\" --overwrite")


def observe_status(m: PoolMachine, status: PoolStatus, out: Out) -> None:
    """A new ``.status``: followed in llmkube and follow mode, a conflict in own mode if foreign."""
    before, m.status = m.status, status
    if m.actuation is Actuation.FOLLOW and m.auto and status.llmkube:
        switch(m, Actuation.LLMKUBE, "LLMKube's reconciler manages this pool (its status "
               "carries LLMKube's conditions)", out)
    elif m.actuation is Actuation.OWN and m.auto and (status.foreign or status.llmkube):
        switch(m, Actuation.LLMKUBE, "LLMKube's reconciler manages this pool (its status "
               "carries LLMKube's conditions or fields we did not write)", out)
    elif m.actuation is Actuation.HANDS_OFF and status.foreign:
        if status != before:  # (a re-list repeats what we saw: not a new write)
            foreign_write(m)
    elif m.actuation is Actuation.OWN and status.foreign:
        switch(m, Actuation.HANDS_OFF, "another controller rewrites this pool's status; run "
               "with --actuation llmkube (or auto) beside LLMKube", out)
    elif m.auto and not m.auto_said:
        out.append(Notice("ActuationChanged", f"actuation auto: {m.actuation.value} (no other "
                          "controller writes this pool's status)", source="auto",
                          target=m.actuation.value))
    m.auto_said = True
    if m.actuation not in (Actuation.LLMKUBE, Actuation.FOLLOW):
        return
    resident = status.resident if status.resident in m.spec.members else ""
    if resident != m.resident:
        m.resident = resident
        m.owner_picked = m.owner_picked or bool(resident)
        m.version += 1
    if status.deferred_reason:
        m.defer(status.deferred_reason, status.deferred_message or
                f"LLMKube deferred the swap ({status.deferred_reason})", out)
    else:
        m.clear_deferral()


def lead(m: PoolMachine, leading: bool, out: Out) -> None:
    """This replica gained or lost the pool's leader Lease: own mode leads, or follows.

    The first answer after start-up is not news (a lone replica always takes the Lease):
    only later changes are told, so the switch's one command, its Notice, is dropped then.
    """
    first, m.leading = m.leading is None, leading
    if m.actuation in (Actuation.OWN, Actuation.FOLLOW):
        switch(m, Actuation.OWN if leading else Actuation.FOLLOW,
               "this replica holds the pool's leader Lease" if leading else
               "another replica holds the pool's leader Lease", [] if first else out)


def switch(m: PoolMachine, actuation: Actuation, reason: str, out: Out) -> None:
    """Hand the pool to ``actuation``; the swap under way continues in the new mode's terms."""
    if actuation is m.actuation:
        return
    before, m.actuation = m.actuation, actuation
    m.auto_said = True
    m.version += 1
    if actuation is Actuation.HANDS_OFF:
        spell = m.hands_off
        spell.spells = spell.spells + 1 if m.now - spell.ended < FIGHT_WINDOW else 1
        spell.quiet_since, spell.token = m.now, m.spec.resume
        reason = f"{reason}; {resume_hint(m)}"
    out.append(Notice("ActuationChanged", f"actuation {before.value} -> {actuation.value}: "
                      f"{reason}", source=before.value, target=actuation.value))
    swap = m.swap
    if actuation is Actuation.HANDS_OFF:
        m.swap = None  # no stage of ours may act any more
        for rid, held in list(m.requests.held.items()):
            if not m.routable(held.member):
                m.requests.unhold(rid)
                out.append(conflict_reject(m, rid, m.now - held.arrived))
        return
    if actuation is Actuation.FOLLOW:
        # The leader carries the swap on; we hold the incumbent's requests until it is done.
        # Our scale wishes die with the lead (the runtime drops them): forget them, so a
        # later lead asks again rather than waiting for a scale-down it never sent.
        m.resident = m.status.resident if m.status.resident in m.spec.members else ""
        m.asked_down.clear()
        if swap is not None:
            swap.stage, swap.load_started, swap.probing = Stage.TRIGGERED, m.now, set()
            swap.scaled_down.clear()
            swap.followed_epoch = m.drain[0]
        return
    if before is Actuation.FOLLOW:
        # The new leader resumes from the cluster's state, as a restarted process does: the
        # resident the old leader recorded, and its swap (drained again before any unload).
        if swap is not None:
            swap.stage, swap.probing, swap.refused = Stage.DRAIN, set(), None
        elif m.status.pending in m.spec.members:
            m.hints = replace(m.hints, pending=m.status.pending)
        return
    if actuation is Actuation.LLMKUBE:
        m.resident = m.status.resident if m.status.resident in m.spec.members else ""
        if swap is not None and swap.stage in (Stage.UNLOAD, Stage.LOAD):
            # Our unload or load was under way: LLMKube's reconciler finishes it from here.
            swap.stage, swap.load_started = Stage.TRIGGERED, m.now
            if m.obs.get(swap.target) is not None and m.obs[swap.target].replicas < 1:
                out.append(Trigger(swap.target))
        elif swap is not None:
            swap.stage, swap.probing, swap.refused = Stage.DRAIN, set(), None


def conflict_reject(m: PoolMachine, rid: int, held_for: float) -> Reject:
    """The answer for a request this pool cannot serve while someone else fights over it."""
    wait = max(1, math.ceil(resume_at(m) - m.now)) if resume_at(m) < math.inf else 0
    return Reject(rid, 503, CONFLICT_CODE, f"pool {m.spec.key} is hands-off: another writer "
                  f"fought over it; {resume_hint(m)}",
                  min(wait, m.limits.retry_after_max) or m.limits.retry_after_default, held_for)


def note_scaled_up(m: PoolMachine, member: str, replicas: int, now: float) -> None:
    """Own mode: a member we asked down, and saw at 0, shows replicas again: someone undid us.

    Seen at 0 first: a watch event older than our patch can still show the old replicas, but
    a stream never goes back, so 0 then >= 1 is somebody's new write. One undo (an operator's
    ``kubectl scale``) is undone again as usual; FIGHT_SCALE_DOWNS of them within
    FIGHT_WINDOW is a fight. Only noted here: the machine hands the pool over after the edges
    have settled (``settle_fight``), since an edge's action must end in its own target stage.
    """
    if member not in m.asked_down:
        return
    if replicas == 0:
        m.asked_down[member] = True  # our scale-down landed
        return
    if not m.asked_down.pop(member):
        return  # not yet seen at 0: this may be an event from before our patch
    times = [t for t in m.undone.get(member, []) if now - t < FIGHT_WINDOW] + [now]
    m.undone[member] = times
    if len(times) >= FIGHT_SCALE_DOWNS and m.actuation is Actuation.OWN and not m.fight:
        m.fight = (f"{member} was scaled up again {len(times)} times after we scaled it down, "
                   f"within {FIGHT_WINDOW:g}s")


def settle_fight(m: PoolMachine, out: Out) -> bool:
    """Hand a fought-over pool to LLMKube (auto) or to no one (own); True if it changed."""
    if not m.fight or m.actuation is not Actuation.OWN:
        return False
    switch(m, Actuation.LLMKUBE if m.auto else Actuation.HANDS_OFF, m.fight, out)
    return True
