"""The guards and actions of llmkube mode: this service is the pool's activator.

LLMKube's ModelPoolReconciler owns member replicas and the pool's status; it drains, probes,
unloads and loads. What is left to us is what its router-proxy does, done better: hold the
requests, trigger a swap only once no request of ours is in flight on the incumbent (the
target's ``spec.replicas`` 0 -> 1, nothing else), hold every new request for the incumbent
from the moment any swap is under way, and release the held requests when the target is
Ready *and* ``status.residentMember`` names it. Which stage each function leads from and to
is written in ``swap.TRANSITIONS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import Command, Notice, Trigger
from .model import PHASE_FAILED, Actuation
from .state import Stage, Swap
from .steps import drained, swap_of

if TYPE_CHECKING:
    from .machine import PoolMachine

Out = list[Command]


def incoming(m: PoolMachine) -> str:
    """The member LLMKube is bringing in, as the cluster shows it ("" if none).

    Our own trigger, ``status.pendingMember``, or a member that is not resident but has
    ``spec.replicas >= 1`` (someone's trigger that the reconciler has not recorded yet).
    """
    swap = m.swap
    if swap is not None and swap.stage is Stage.TRIGGERED:
        return swap.target
    announced = m.drain[1]  # follow mode: the leader's drain announcement comes first
    if m.actuation is Actuation.FOLLOW and announced in m.spec.members and announced != m.resident:
        return announced
    # A member whose load just failed is not coming in (LLMKube gives way to the next request).
    def coming(name: str) -> bool:
        obs = m.obs.get(name)
        return name in m.spec.members and name != m.resident and name not in m.failed_until \
            and (obs is None or obs.phase != PHASE_FAILED)

    if m.status.pending and coming(m.status.pending):
        return m.status.pending
    return next((name for name in m.spec.members if coming(name) and name in m.obs
                 and m.obs[name].replicas > 0), "")


def someone_swaps(m: PoolMachine, now: float) -> bool:
    """A swap we did not start is under way (seen in the status or in replicas)."""
    return bool(incoming(m))


def follow_swap(m: PoolMachine, now: float, out: Out) -> None:
    """Follow it: the incumbent's new requests are held from now, held ones released after."""
    target = incoming(m)
    m.swap = Swap(target=target, incumbent=m.resident, started=now, stage=Stage.TRIGGERED,
                  load_started=now, followed_epoch=m.drain[0])
    m.owner_picked = True
    m.version += 1
    by = "LLMKube" if m.actuation is Actuation.LLMKUBE else "the replica leading the pool"
    out.append(Notice("SwapStarted", f"swap {m.resident or '(none)'} -> {target} started "
                      f"(by {by})", source=m.resident, target=target))


def leader_dropped(m: PoolMachine, now: float) -> bool:
    """Follow mode: the leader gave the swap up (a cancelled reclaim, a change of hands): a
    newer announcement no longer names its target, nor does the status."""
    swap = swap_of(m)
    return m.drain[0] > swap.followed_epoch and m.drain[1] != swap.target \
        and m.status.pending != swap.target and m.status.resident != swap.target


def stop_following(m: PoolMachine, now: float, out: Out) -> None:
    """Back to Idle: the incumbent's held requests pass again once it may be routed to."""
    swap = swap_of(m)
    m.swap = None
    m.version += 1
    out.append(Notice("SwapCancelled", f"swap {swap.incumbent or '(none)'} -> {swap.target} "
                      "given up by the replica leading the pool", source=swap.incumbent,
                      target=swap.target))


def drained_here(m: PoolMachine, now: float) -> bool:
    """No request of ours is in flight elsewhere, the linger is over, and no other member is
    coming in (a second trigger while LLMKube swaps would be read as a competing owner)."""
    return drained(m, now) and incoming(m) in ("", swap_of(m).target)


def trigger(m: PoolMachine, now: float, out: Out) -> None:
    """Patch the target's replicas 0 -> 1 (unless someone already did) and wait for LLMKube."""
    swap = swap_of(m)
    target = m.obs[swap.target]
    swap.stage, swap.load_started, swap.phase_at_load = Stage.TRIGGERED, now, target.phase
    m.version += 1
    if target.replicas < 1:
        out.append(Trigger(swap.target))
    else:
        swap.saw_progress = True  # already asked up: its phase is current


def target_resident(m: PoolMachine, now: float) -> bool:
    """The target is Ready and LLMKube's status names it resident: release its requests."""
    swap = swap_of(m)
    return m.status.resident == swap.target and m.obs[swap.target].ready
