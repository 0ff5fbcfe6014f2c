"""swapPolicy: which values this version runs, and when an idle resident gives the slot back.

``sticky`` keeps the resident until a request needs another member. ``reclaim`` (LLMKube's
newer API) also swaps back to ``spec.default`` once the resident has had nothing in flight or
held for ``spec.reclaimAfter``. ``reclaim-down`` (LLMKube 0.11) releases the slot instead: the
idle resident, whichever member it is, is drained and unloaded and the pool is left cold (no
resident) until a request loads a member again; a cold pool under it does not warm
``spec.default`` either. The edge itself is a row of ``swap.TRANSITIONS`` (its guard and
action in ``steps.py``; a release is a swap whose target is ""). Any other value (``priority``
on an LLMKube branch, whatever comes next) runs as sticky and is reported, so a newer spec
never breaks a pool.

All of it is own mode's: in llmkube mode reclaim is LLMKube's reconciler's job (this service
follows ``status.residentMember``, empty for a cold pool), and the status, with its
SpecValid, is LLMKube's to write.

Rules of this file: it owns ``PolicyMemory`` (the resident's idle clock and what the status was
told) and changes nothing else; it reads the pool through ``pool.PoolReader``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .autoscaled import autoscaler
from .events import Command, Notice
from .model import Actuation
from .pool import PoolReader

STICKY, RECLAIM, RECLAIM_DOWN = "sticky", "reclaim", "reclaim-down"
SUPPORTED_POLICIES = (STICKY, RECLAIM, RECLAIM_DOWN)
RECLAIMING = (RECLAIM, RECLAIM_DOWN)  # the policies that run an idle clock


@dataclass(slots=True)
class PolicyMemory:
    """The resident's idle clock, and what the status was last told of the swapPolicy."""

    resident_since: float  # when the resident took the slot
    resident_was: str = ""  # the resident that clock runs for
    idle_shown: float | None = None  # status.residentIdleSince (``track_idle``)
    policy_reported: str = ""  # the unsupported swapPolicy last reported

    def took_slot(self, member: str, now: float) -> None:
        """``member`` took the slot at ``now``: its idle clock starts."""
        self.resident_was, self.resident_since = member, now


def unsupported(m: PoolReader) -> str:
    """The pool's swapPolicy if this version does not implement it, else "" (and "" outside
    own mode: there LLMKube runs the policy)."""
    if m.actuation is not Actuation.OWN or m.spec.swap_policy in SUPPORTED_POLICIES:
        return ""
    return m.spec.swap_policy


def report_policy(memory: PolicyMemory, m: PoolReader, out: list[Command]) -> None:
    """Tell operators once per value that the pool's swapPolicy runs as sticky."""
    policy = unsupported(m)
    if policy == memory.policy_reported:
        return
    memory.policy_reported = policy
    if policy:
        out.append(Notice("UnsupportedSwapPolicy", f"swapPolicy {policy!r} is not supported "
                          f"by this version (it runs {', '.join(SUPPORTED_POLICIES)}); the "
                          "pool runs as sticky", source=policy))


def resident_idle_since(m: PoolReader) -> float | None:
    """Since when the serving resident has had nothing in flight or held (None: it has, or
    a swap is under way: the slot is moving anyway)."""
    resident = m.resident
    if m.swap is not None or not m.routable(resident) or m.requests.busy(resident) \
            or m.requests.held_by.get(resident):
        return None
    return max(m.requests.idle_since(resident), m.resident_since)


def reclaim_target(m: PoolReader) -> str:
    """Where an idle resident's slot goes: spec.default (``reclaim``), "" (``reclaim-down``:
    nowhere, the pool goes cold)."""
    return "" if m.spec.swap_policy == RECLAIM_DOWN else m.spec.default


def reclaim_at(m: PoolReader) -> float:
    """When an idle resident is due to give the slot back (inf: not due ever): a non-default
    one under ``reclaim``, any one under ``reclaim-down``."""
    spec = m.spec
    if m.actuation is not Actuation.OWN or spec.swap_policy not in RECLAIMING:
        return math.inf
    if spec.swap_policy == RECLAIM and (
            not spec.default or m.resident == spec.default
            or spec.default in m.failed_until
            or autoscaler(m, spec.default)):  # (a default failing to load waits its backoff)
        return math.inf
    since = resident_idle_since(m)
    return math.inf if since is None else since + spec.reclaim_after


def track_idle(memory: PolicyMemory, m: PoolReader, now: float) -> None:
    """Update the resident's start and status.residentIdleSince.

    As LLMKube's CRD defines it: only for a resident whose reclaim that clock runs (a
    non-default one under ``reclaim``, any under ``reclaim-down``); shown once idle for
    ``Limits.idle_report``.
    """
    if m.resident != memory.resident_was:
        memory.took_slot(m.resident, now)
    since = resident_idle_since(m)
    memory.idle_shown = since if since is not None and reclaim_at(m) < math.inf \
        and now >= since + m.limits.idle_report else None


def idle_deadline(m: PoolReader) -> float:
    """The next time idleness changes something: the status report or a reclaim."""
    reclaim = reclaim_at(m)
    since = resident_idle_since(m)
    if reclaim == math.inf or since is None:
        return math.inf
    # ``since`` itself, not ``reclaim - reclaimAfter``: the float difference can round below
    # ``since``, giving a report time at which track_idle (which adds to ``since``) does not
    # report yet, and a deadline that a Tick never consumes.
    report = since + m.limits.idle_report if m.idle_shown is None else math.inf
    # A reclaim already due waits for the pool to be whole again (a Degraded pool makes no
    # replica changes); the observation that heals it re-runs the edges, not a timer.
    return min(report, reclaim if reclaim > m.now else math.inf)
