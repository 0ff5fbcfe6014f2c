"""The watchdog for swaps that stopped moving: what operators of every peer miss most.

While a swap unloads, loads or waits for LLMKube (Triggered), every change in what the cluster
reports about the members involved (and, when LLMKube carries the swap, in the pool's status)
is progress. When none comes for ``Limits.stall_after``, the swap is marked stalled with what
is missing (a SwapStalled condition, a Warning Event, a gauge); the next change clears it.
The watchdog never changes the swap's stage: ``swap_timeout`` still decides failure, this
only makes a wedge visible long before that. One thing follows from the mark: a stalled
trigger whose target has no pod lets the resident serve again (``steps_llmkube.py``).

Rules of this file: its state is the swap's own record of progress (``Swap.progress_mark``,
``progress_at``, ``stalled``: it lives and dies with the swap it watches, so it stays on
``state.Swap``), and it changes nothing else; it reads the pool through ``pool.PoolReader``.
"""

from __future__ import annotations

import math

from .events import Command, Notice
from .model import Actuation
from .pool import PoolReader
from .state import Stage

_WATCHED = (Stage.UNLOAD, Stage.LOAD, Stage.TRIGGERED)


def watch(m: PoolReader, now: float, out: list[Command]) -> None:
    """Record progress of the swap under way, and mark or clear it as stalled."""
    swap = m.swap
    if swap is None or swap.stage not in _WATCHED:
        return
    mark = (swap.stage, m.status if swap.stage is Stage.TRIGGERED else None,
            tuple(m.obs.get(name) for name in _involved(m)))
    if mark != swap.progress_mark:
        swap.progress_mark, swap.progress_at = mark, now
        if swap.stalled:
            swap.stalled = ""
            out.append(Notice("SwapResumed", f"swap to {swap.target or '(none)'} is moving again",
                              source=swap.incumbent, target=swap.target))
    elif not swap.stalled and now >= swap.progress_at + m.limits.stall_after:
        swap.stalled = missing(m, now - swap.progress_at)
        out.append(Notice("SwapStalled", f"swap to {swap.target or '(none)'} has made no "
                          f"progress: {swap.stalled}", source=swap.incumbent, target=swap.target))


def deadline(m: PoolReader) -> float:
    """When the swap under way would count as stalled (inf: not watched, or already is)."""
    swap = m.swap
    if swap is None or swap.stage not in _WATCHED or swap.stalled:
        return math.inf
    return swap.progress_at + m.limits.stall_after


def missing(m: PoolReader, quiet: float) -> str:
    """What the stage waits for, in words, after ``quiet`` seconds without a change."""
    swap = m.swap
    assert swap is not None
    if swap.stage is Stage.UNLOAD:
        left = [m.obs[name] for name in m.others() if name in m.obs and not m.obs[name].unloaded]
        return "; ".join(f"{o.name} still has {o.replicas} replica(s) and {o.pods} pod(s) "
                         f"(phase {o.phase or 'unknown'}) after {quiet:.0f}s" for o in left) \
            or "waiting for the unloaded members to be observed"
    target = m.obs[swap.target]
    if swap.stage is Stage.TRIGGERED:
        return (f"{'LLMKube' if m.actuation is Actuation.LLMKUBE else 'the leading replica'} "
                f"has not moved the swap for {quiet:.0f}s: target {target.name} has "
                f"{target.replicas} replica(s) and {target.pods} pod(s) (phase "
                f"{target.phase or 'unknown'}); the status names {m.status.resident or 'no'} "
                f"resident, {m.status.pending or 'nothing'} pending")
    if target.replicas < 1:
        return f"target {target.name} is not scaled up yet (replicas 0)"
    if target.pods == 0:
        return f"target {target.name} has no pod after {quiet:.0f}s"
    return (f"target {target.name}'s {target.pods} pod(s) are not getting ready (phase "
            f"{target.phase or 'unknown'} unchanged for {quiet:.0f}s)")


def _involved(m: PoolReader) -> list[str]:
    swap = m.swap
    assert swap is not None
    if swap.stage is Stage.TRIGGERED:
        return [swap.target, *([swap.incumbent] if swap.incumbent else [])]
    return m.others() if swap.stage is Stage.UNLOAD else [swap.target]
