"""Prompt-cache carry-over: save a llama.cpp member's slots before it unloads, restore them
when it loads again, before its held requests pass.

Opt-in per member (``MemberObservation.carry``: its annotation
``modelpool.inference.llmkube.dev/carry-prompt-cache: "true"``). The phases, as edges of
``swap.TRANSITIONS`` wrapped around the stages' own guards:

* save: own mode, in Unloading, once the members giving up the slot are drained (and probed)
  and before their Scale(0); llmkube mode, in Draining, once our own requests drained and
  before the trigger (LLMKube unloads the incumbent itself). ``CarrySlots(member, "save")``;
* restore: own mode, when the target is Ready; llmkube mode, when LLMKube's status names it
  resident: ``CarrySlots(member, "restore")`` before ``steps.complete`` releases its held
  requests, if this process saved the member's slots when it last gave up the slot. A
  follower (own mode) restores nothing: the leader names the target resident only after its
  restore, and the follower releases on that. In llmkube mode with several replicas the one
  that saved (the one that triggered) restores; the others release once LLMKube names the
  member resident, which may be before the restore is done.
* while a member's slots are saved or restored it serves nothing (``PoolMachine.serving``):
  a request landing on it would keep a slot busy, and a drained incumbent must stay drained
  until its Scale(0).

Every step fails open. The swap waits for an answer at most ``Limits.carry_timeout``, and a
step is only taken while the oldest held request's budget has room for it (a save: for the
save, the swap as the history expects it, and a restore; a restore: for the restore), so no
request waits past its budget because of carry-over. A failed, late or skipped step is a
``PromptCacheCarryFailed`` Notice (Warning Event, log, the notices counter); a step that took
effect is ``PromptCacheCarried``. The I/O (llama.cpp's slot API) and the check that a restore
took effect (``n_restored``) are the runtime's; it answers with ``CarryAnswered``.

Rules of this file: it owns no state but ``carrybook.CarryBook`` (``m.carry``), which it
changes through that record's methods; it reads the pool through ``pool.PoolReader``.
"""

from __future__ import annotations

from collections.abc import Callable

from .carrybook import CarryBook as CarryBook  # (the machine makes its record from here)
from .events import CarryAnswered, CarrySlots, Command, Notice
from .model import Actuation
from .pool import PoolReader, PoolWriter

SAVE, RESTORE = "save", "restore"
Guard = Callable[[PoolReader, float], bool]
Out = list[Command]


def _enabled(m: PoolReader, member: str) -> bool:
    obs = m.obs.get(member)
    return obs is not None and obs.carry and obs.ready


def _started(m: PoolReader) -> float:
    assert m.swap is not None
    return m.swap.started


def _to_save(m: PoolReader) -> list[str]:
    """Members giving up the slot whose slots are still to be saved in this swap."""
    swap = m.swap
    if swap is None or m.actuation not in (Actuation.OWN, Actuation.LLMKUBE):
        return []
    book = m.carry.of(swap.started)
    return [name for name in m.others() if name not in swap.scaled_down and _enabled(m, name)
            and (name, SAVE) not in book.waiting and (name, SAVE) not in book.finished]


def _to_restore(m: PoolReader) -> list[str]:
    swap = m.swap
    if swap is None or m.actuation not in (Actuation.OWN, Actuation.LLMKUBE) \
            or not _enabled(m, swap.target) or swap.target not in m.carry.saved:
        return []
    book = m.carry.of(swap.started)
    key = (swap.target, RESTORE)
    return [] if key in book.waiting or key in book.finished else [swap.target]


def carrying(m: PoolReader, member: str) -> bool:
    """``member``'s slots are being restored, or saved in this swap: it serves nothing now
    (a request landing on it would keep its slot busy, and a drained incumbent must stay so
    until it is unloaded)."""
    swap = m.swap
    if swap is None:
        return False
    # A target whose restore is due but not asked yet serves nothing either: LLMKube's status
    # may name it resident, Ready, before the restore edge has run, and a held request let
    # through then lands on its empty slots (seen with real llama.cpp members: cache_n 0).
    if member == swap.target and member in _to_restore(m):
        return True
    if m.carry.swap_started != swap.started:
        return False
    book = m.carry
    return (member, RESTORE) in book.waiting or (member, SAVE) in book.waiting \
        or (member, SAVE) in book.finished


def save_due(ready: Guard) -> Guard:
    """Guard: ``ready`` (the unload or the trigger may go) and slots are to be saved first."""
    def guard(m: PoolReader, now: float) -> bool:
        return ready(m, now) and bool(_to_save(m))
    return guard


def restore_due(ready: Guard) -> Guard:
    """Guard: ``ready`` (the target's requests may pass) and its slots are to be restored."""
    def guard(m: PoolReader, now: float) -> bool:
        return ready(m, now) and bool(_to_restore(m))
    return guard


def unless_carrying(guard: Guard) -> Guard:
    """``guard``, once no step of this swap is still waited for (answered or timed out)."""
    def wrapped(m: PoolReader, now: float) -> bool:
        return guard(m, now) and not m.carry.waiting_in(_started(m))
    return wrapped


def _room(m: PoolReader, now: float) -> float:
    """Seconds left of the oldest held request's budget (inf when none is held)."""
    return m.requests.next_deadline() - now


def ask_save(m: PoolWriter, now: float, out: Out) -> None:
    """Ask for the saves, where the budget has room for them; skip (and say so) the rest."""
    swap, timeout = m.swap, m.limits.carry_timeout
    assert swap is not None
    needed = 2 * timeout + m.history.expected(swap.incumbent, swap.target)
    for name in _to_save(m):
        _ask(m, name, SAVE, now, needed, out)


def ask_restore(m: PoolWriter, now: float, out: Out) -> None:
    """Ask for the target's restore, if the budget has room for it."""
    for name in _to_restore(m):
        _ask(m, name, RESTORE, now, m.limits.carry_timeout, out)


def _ask(m: PoolWriter, member: str, step: str, now: float, needed: float, out: Out) -> None:
    started = _started(m)
    if _room(m, now) < needed:
        m.carry.skip(started, member, step)
        out.append(_failed(m, member, step, f"skipped: the held requests' budget has "
                           f"{_room(m, now):.1f}s left, {needed:.1f}s needed"))
        return
    m.carry.ask(started, member, step, now + m.limits.carry_timeout)
    out.append(CarrySlots(member, step))


def overdue(m: PoolReader, now: float) -> bool:
    """Guard: a step of this swap was not answered in time."""
    return any(until <= now for until in m.carry.waiting_in(_started(m)).values())


def give_up(m: PoolWriter, now: float, out: Out) -> None:
    """The swap goes on without the late steps (their answers are ignored when they come)."""
    for (member, step), until in list(m.carry.waiting_in(_started(m)).items()):
        if until <= now:
            m.carry.finish(member, step)
            out.append(_failed(m, member, step, f"no answer within "
                               f"{m.limits.carry_timeout:g}s; the swap goes on without it"))


def answered(m: PoolWriter, event: CarryAnswered, out: Out) -> None:
    """The runtime's answer: the waiting stage may go on; a failure is said."""
    if m.swap is None or m.carry.swap_started != m.swap.started \
            or not m.carry.finish(event.member, event.step):
        return  # late (given up, or the swap ended): it changes nothing now
    if event.ok:
        if event.step == SAVE:
            m.carry.keep(event.member)
        out.append(Notice("PromptCacheCarried", f"prompt cache of {event.member}: "
                          f"{event.step} done ({event.detail})", source=event.member,
                          target=m.swap.target))
    else:
        out.append(_failed(m, event.member, event.step, event.detail))


def deadlines(m: PoolReader) -> list[float]:
    """When waited-for steps time out (for the machine's timer)."""
    return list(m.carry.waiting_in(m.swap.started).values()) if m.swap is not None else []


def _failed(m: PoolReader, member: str, step: str, why: str) -> Notice:
    target = m.swap.target if m.swap is not None else ""
    return Notice("PromptCacheCarryFailed", f"prompt cache of {member}: {step} failed open "
                  f"({why}); no request waits for it", source=member, target=target)
