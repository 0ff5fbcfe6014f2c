"""Who actuates a pool, and how the machine changes hands: the status LLMKube writes, the
auto mode's choice, and the fight detector of own mode.

Rules of this file
------------------
* It owns ``Hands``: who actuates the pool (``actuation``, the auto mode's choice), the fight
  detector's memory (``FightMemory``) and own mode's hands-off spells (``HandsOff``). Nothing
  else changes them; the machine reads ``actuation`` from here.
* It reads the pool through ``pool.PoolReader``. A change of hands (``switch``) also changes
  what follows from it through the machine's own methods (``pool.PoolWriter``: the resident,
  the swap, the start hints) and the swap's stage: the one change of stage made outside
  ``swap.TRANSITIONS``, because it is not an edge of either mode but the move from one mode's
  graph to the other's. The machine does it between events, never inside an edge.

Hands-off is a spell, not a verdict. Own mode stops actuating a pool that another writer
fights over (its status rewritten, a member's replicas set by a controller that will set them
again, ``writers.py``, or a member scaled up again FIGHT_SCALE_DOWNS times), but an operator
trying ``kubectl scale`` a few times is not a controller (each write is reported, naming its
field manager, and only repeated ones hand the pool off): once no foreign write
has been seen for ``hands_off_quiet`` (doubling for each new spell within FIGHT_WINDOW of the
last, up to 16x), the pool resumes, and a new value of the annotation RESUME_ANNOTATION ends
the spell at once. Meanwhile every member the cluster shows Ready is routed to, and the rest
get 503 ``pool_conflict`` saying when and how the pool resumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import writers
from .events import Command, Notice, Reject, Trigger
from .model import Actuation, MemberObservation, PoolStatus
from .pool import PoolReader, PoolWriter
from .state import Stage
from ..names import RESUME_ANNOTATION

Out = list[Command]

# Own mode: a member we scale down this many times within FIGHT_WINDOW seconds is being
# scaled up again by someone else on purpose (a GitOps controller re-applying replicas, a
# second operator), not by a one-off `kubectl scale`: we stop actuating instead of flapping.
FIGHT_SCALE_DOWNS = 3
FIGHT_WINDOW = 600.0
CONFLICT_CODE = "pool_conflict"
MAX_SPELL_FACTOR = 16


@dataclass(slots=True)
class HandsOff:
    """Own mode's hands-off spells: how many in a row, the last foreign write, how to end it."""

    spells: int = 0
    quiet_since: float = -math.inf  # the last foreign write seen during the spell
    ended: float = -math.inf  # when the last spell ended
    token: str = ""  # the resume annotation's value when the spell began
    reason: str = ""  # what the spell's notice said (the other writer, the remedy)
    over_status: bool = False  # the fight is over the pool's status: we stop writing it too


@dataclass(slots=True)
class FightMemory:
    """Own mode's fight detector (``note_scaled_up``): who we asked down, who undid us, why."""

    asked_down: dict[str, bool] = field(default_factory=dict)  # member -> seen at 0 since
    undone: dict[str, list[float]] = field(default_factory=dict)  # member -> when, recently
    fight: str = ""  # why we think someone scales against us ("" if not)
    writer: str = ""  # the field manager of the last foreign replica write ("" : not known)

    def asked(self, member: str, replicas: int) -> None:
        """We ask for ``member`` at ``replicas``: a scale-down is watched for an undo."""
        if replicas:
            self.asked_down.pop(member, None)
        else:
            self.asked_down[member] = False

    def forget(self) -> None:
        """A new start: nothing asked down, nothing undone, no fight."""
        self.asked_down.clear()
        self.undone.clear()
        self.fight = self.writer = ""


@dataclass(slots=True)
class Hands:
    """Who actuates the pool, and what own mode remembers of the writers it met."""

    actuation: Actuation
    auto: bool = False  # own until the status shows another controller, then llmkube
    auto_said: bool = False  # (auto mode names its choice once per pool)
    fights: FightMemory = field(default_factory=FightMemory)
    spell: HandsOff = field(default_factory=HandsOff)


def shown_hands_off(hands: Hands) -> str:
    """Why own mode stopped actuating, for the status's Actuating condition ("" : it did
    not, or the fight is over the status itself, which we then leave to the other writer)."""
    if hands.actuation is not Actuation.HANDS_OFF or hands.spell.over_status:
        return ""
    return hands.spell.reason


def quiet_needed(m: PoolReader, hands: Hands) -> float:
    """How long the spell under way lasts without a foreign write."""
    return m.limits.hands_off_quiet * min(MAX_SPELL_FACTOR, 2.0 ** max(0, hands.spell.spells - 1))


def resume_at(m: PoolReader, hands: Hands) -> float:
    """When the hands-off spell under way ends by itself (inf: none under way)."""
    if hands.actuation is not Actuation.HANDS_OFF:
        return math.inf
    return hands.spell.quiet_since + quiet_needed(m, hands)


def foreign_write(m: PoolReader, hands: Hands) -> None:
    """A write that was not ours (a replica change, a foreign status) restarts the quiet clock."""
    if hands.actuation is Actuation.HANDS_OFF:
        hands.spell.quiet_since = m.now


def resume(m: PoolWriter, hands: Hands, out: Out) -> bool:
    """End the hands-off spell when it has been quiet long enough or the annotation says so."""
    if hands.actuation is not Actuation.HANDS_OFF:
        return False
    if m.spec.resume != hands.spell.token:
        why = f"annotation {RESUME_ANNOTATION} changed"
    elif m.now >= resume_at(m, hands):
        why = f"no foreign write for {quiet_needed(m, hands):g}s"
    else:
        return False
    hands.spell.ended = m.now
    hands.fights.forget()
    switch(m, hands, Actuation.OWN, f"hands-off over ({why}); actuating again", out)
    return True


def resume_hint(m: PoolReader, hands: Hands) -> str:
    """How the spell ends, for the Event that announces it and the answers it gives."""
    key = m.spec.key
    return (f"this router routes only to members the cluster shows Ready and resumes "
            f"actuating after {quiet_needed(m, hands):g}s without a foreign write, or at once "
            f"with: kubectl annotate mpool {key.name} -n {key.namespace} "
            f"{RESUME_ANNOTATION}=\"$(date +%s)\" --overwrite")


def observe_status(m: PoolWriter, hands: Hands, before: PoolStatus, out: Out) -> None:
    """A new ``.status`` (``m.status``, ``before`` it): followed in llmkube and follow mode, a
    conflict in own mode if foreign."""
    status = m.status
    if hands.actuation is Actuation.FOLLOW and hands.auto and status.llmkube:
        switch(m, hands, Actuation.LLMKUBE, "LLMKube's reconciler manages this pool (its "
               "status carries LLMKube's conditions)", out)
    elif hands.actuation is Actuation.OWN and hands.auto and (status.foreign or status.llmkube):
        switch(m, hands, Actuation.LLMKUBE, "LLMKube's reconciler manages this pool (its "
               "status carries LLMKube's conditions or fields we did not write)", out)
    elif hands.actuation is Actuation.HANDS_OFF and status.foreign:
        if status != before:  # (a re-list repeats what we saw: not a new write)
            foreign_write(m, hands)
    elif hands.actuation is Actuation.OWN and status.foreign:
        hands.spell.over_status = True
        who = writers.named(status.written_by) if status.written_by else "another controller"
        switch(m, hands, Actuation.HANDS_OFF, f"{who} rewrites this pool's status; run with "
               "--actuation llmkube (or auto) beside LLMKube", out, writer=status.written_by)
    elif hands.auto and not hands.auto_said:
        out.append(Notice("ActuationChanged", f"actuation auto: {hands.actuation.value} (no "
                          "other controller writes this pool's status)", source="auto",
                          target=hands.actuation.value))
    hands.auto_said = True
    if hands.actuation not in (Actuation.LLMKUBE, Actuation.FOLLOW):
        return
    resident = status.resident if status.resident in m.spec.members else ""
    if resident != m.resident:
        m.set_resident(resident)
        if resident:
            m.pick_owner()
    if status.deferred_reason:
        m.defer(status.deferred_reason, status.deferred_message or
                f"LLMKube deferred the swap ({status.deferred_reason})", out)
    else:
        m.clear_deferral()


def lead(m: PoolWriter, hands: Hands, first: bool, leading: bool, out: Out) -> None:
    """This replica gained or lost the pool's leader Lease: own mode leads, or follows.

    The ``first`` answer after start-up is not news (a lone replica always takes the Lease):
    only later changes are told, so the switch's one command, its Notice, is dropped then.
    """
    if hands.actuation in (Actuation.OWN, Actuation.FOLLOW):
        switch(m, hands, Actuation.OWN if leading else Actuation.FOLLOW,
               "this replica holds the pool's leader Lease" if leading else
               "another replica holds the pool's leader Lease", [] if first else out)


def switch(m: PoolWriter, hands: Hands, actuation: Actuation, reason: str, out: Out, *,
           writer: str = "") -> None:
    """Hand the pool to ``actuation``; the swap under way continues in the new mode's terms.
    ``writer``: the other field manager that made us hand it over, named in the Notice."""
    if actuation is hands.actuation:
        return
    before, hands.actuation = hands.actuation, actuation
    hands.auto_said = True
    if actuation is Actuation.HANDS_OFF:
        spell = hands.spell
        spell.spells = spell.spells + 1 if m.now - spell.ended < FIGHT_WINDOW else 1
        spell.quiet_since, spell.token = m.now, m.spec.resume
        reason = spell.reason = f"{reason}; {resume_hint(m, hands)}"
    out.append(Notice("ActuationChanged", f"actuation {before.value} -> {actuation.value}: "
                      f"{reason}", source=before.value, target=actuation.value, writer=writer))
    swap = m.swap
    status_resident = m.status.resident if m.status.resident in m.spec.members else ""
    if swap is not None and not swap.target and actuation is not Actuation.OWN:
        m.end_swap()  # a release (reclaim-down) is own mode's alone: nothing to follow
        swap = None
    if actuation is Actuation.HANDS_OFF:
        m.end_swap()  # no stage of ours may act any more
        for rid, held in list(m.requests.held.items()):
            if not m.routable(held.member):
                m.requests.unhold(rid)
                out.append(conflict_reject(m, hands, rid, m.now - held.arrived))
        return
    if actuation is Actuation.FOLLOW:
        # The leader carries the swap on; we hold the incumbent's requests until it is done.
        # Our scale wishes die with the lead (the runtime drops them): forget them, so a
        # later lead asks again rather than waiting for a scale-down it never sent.
        m.set_resident(status_resident)
        hands.fights.asked_down.clear()
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
            m.set_pending_hint(m.status.pending)
        return
    if actuation is Actuation.LLMKUBE:
        m.set_resident(status_resident)
        if swap is not None and swap.stage in (Stage.UNLOAD, Stage.LOAD):
            # Our unload or load was under way: LLMKube's reconciler finishes it from here.
            swap.stage, swap.load_started = Stage.TRIGGERED, m.now
            if m.obs.get(swap.target) is not None and m.obs[swap.target].replicas < 1:
                out.append(Trigger(swap.target))
        elif swap is not None:
            swap.stage, swap.probing, swap.refused = Stage.DRAIN, set(), None


def conflict_reject(m: PoolReader, hands: Hands, rid: int, held_for: float) -> Reject:
    """The answer for a request this pool cannot serve while someone else fights over it."""
    until = resume_at(m, hands)
    wait = max(1, math.ceil(until - m.now)) if until < math.inf else 0
    return Reject(rid, 503, CONFLICT_CODE, f"pool {m.spec.key} is hands-off: another writer "
                  f"fought over it; {resume_hint(m, hands)}",
                  min(wait, m.limits.retry_after_max) or m.limits.retry_after_default, held_for)


def note_writer(m: PoolReader, hands: Hands, before: MemberObservation | None,
                obs: MemberObservation, out: Out) -> None:
    """A member's replicas changed, and a field manager other than ours owns them.

    Own mode: reported at once, naming the manager and the remedy. A controller that will
    write them again (``writers.Writer.controller``: Argo CD, Flux, Helm, an autoscaler) is a
    fight at once: undoing it would only flap the member. A person's ``kubectl scale`` (or a
    client we do not know) is undone as the pool needs, and counted by ``note_scaled_up``.
    Replicas set to 0 with no manager left owning them are a /scale write
    (``writers.replicas_writer``), never ours (every write of ours names OUR_MANAGER), and go
    the person's way. llmkube mode: a write by neither us nor LLMKube's reconciler is
    reported the same way, and that is all (the replicas are the reconciler's to judge).
    """
    if hands.actuation not in (Actuation.OWN, Actuation.LLMKUBE) or before is None \
            or before.replicas == obs.replicas:
        return
    manager = writers.replicas_writer(before.replicas_by, obs.replicas_by, obs.replicas)
    if hands.actuation is Actuation.LLMKUBE:
        if writers.beside_llmkube(manager):
            out.append(Notice("ReplicasWritten", writers.replicas_written_beside_llmkube(
                obs.name, obs.replicas, manager), source=obs.name, writer=manager))
        return
    if not writers.foreign(manager):
        return
    hands.fights.writer = manager
    message = writers.replicas_written(obs.name, obs.replicas, manager)
    if writers.classify(manager).controller:
        hands.fights.fight = hands.fights.fight or message  # (the hands-off notice says it)
        return
    out.append(Notice("ReplicasWritten", message, source=obs.name, writer=manager))


def note_scaled_up(hands: Hands, member: str, replicas: int, now: float) -> None:
    """Own mode: a member we asked down, and saw at 0, shows replicas again: someone undid us.

    Seen at 0 first: a watch event older than our patch can still show the old replicas, but
    a stream never goes back, so 0 then >= 1 is somebody's new write. One undo (an operator's
    ``kubectl scale``) is undone again as usual; FIGHT_SCALE_DOWNS of them within
    FIGHT_WINDOW is a fight. Only noted here: the machine hands the pool over after the edges
    have settled (``settle_fight``), since an edge's action must end in its own target stage.
    """
    fights = hands.fights
    if member not in fights.asked_down:
        return
    if replicas == 0:
        fights.asked_down[member] = True  # our scale-down landed
        return
    if not fights.asked_down.pop(member):
        return  # not yet seen at 0: this may be an event from before our patch
    times = [t for t in fights.undone.get(member, []) if now - t < FIGHT_WINDOW] + [now]
    fights.undone[member] = times
    if len(times) >= FIGHT_SCALE_DOWNS and hands.actuation is Actuation.OWN \
            and not fights.fight:
        by = f", last by {writers.named(fights.writer)}" if fights.writer else ""
        fights.fight = (f"{member} was scaled up again {len(times)} times after we scaled it "
                        f"down, within {FIGHT_WINDOW:g}s{by}")


def fought_by_controller(hands: Hands) -> bool:
    """Whether the fight noted is with a controller that writes again (``note_writer``)."""
    return bool(hands.fights.writer) and writers.classify(hands.fights.writer).controller


def settle_fight(m: PoolWriter, hands: Hands, out: Out) -> bool:
    """Hand a fought-over pool to LLMKube (auto) or to no one (own); True if it changed."""
    if not hands.fights.fight or hands.actuation is not Actuation.OWN:
        return False
    writer = hands.fights.writer
    # auto mode takes an unnamed fighter for LLMKube's reconciler; a named one is not
    llmkube = hands.auto and writers.label(writer) in ("other", "unrecorded", "unknown")
    hands.spell.over_status = False
    switch(m, hands, Actuation.LLMKUBE if llmkube else Actuation.HANDS_OFF,
           hands.fights.fight, out, writer=writer)
    return True
