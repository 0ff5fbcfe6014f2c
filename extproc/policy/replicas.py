"""Several replicas of this service on one pool: what a pool's machine knows of the others.

Roles (own mode). One replica leads each pool (the platform holds a leader Lease for it): its
machine runs in ``Actuation.OWN`` and decides and actuates. Every other replica's machine runs
in ``Actuation.FOLLOW``: it holds requests, publishes its held and in-flight counts (the
platform's membership Lease), follows the leader's status and drain announcement, and releases
its own held requests when the target is Ready and named resident. llmkube mode needs no
leader: LLMKube's reconciler actuates, and every replica may trigger.

Two-phase drain. While the leader swaps, it announces the target in its leader Lease under a
new epoch (``announcement``). A follower that has seen epoch ``e`` admits to no other member
from then on and acknowledges ``e`` in its membership Lease, with its in-flight counts in the
same write. The leader unloads only when each live peer acknowledged the epoch now in the
Lease with nothing in flight on the members giving up the slot, and each lost peer is settled:
the idle probe said idle, or ``lost_replica_wait`` has passed since it fell silent (its
requests may still be streaming: with Envoy failing open, a dead replica's routed responses
continue). Measuring after the acknowledgements closes the window in which a follower admits
one more request after the leader looked.

Fail closed. ``admit_until`` (``AdmissionLease``): past it this replica admits nothing, so a
replica cut off from the API server stops routing before its peers may count it lost.

With no peers every rule here is vacuous: one replica behaves exactly as before.

Rules of this file: it owns ``Fleet`` (what this replica knows of the others and of its own
standing) and changes nothing else; it reads the pool through ``pool.PoolReader``, whose
``drain`` and ``admit_until`` are this file's, read back from ``Fleet`` by the machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import Actuation, PeerState
from .pool import PoolReader

UNAVAILABLE_CODE = "replica_unavailable"
REWRITING = "\0"  # Fleet.drain's target while the leader's new announcement is being written
# The announced target of a release (reclaim-down: a swap to no member). Not a Kubernetes
# name, so a follower (of any version) admits to no member while it is announced.
RELEASING = "(none)"


@dataclass(slots=True)
class Fleet:
    """What this replica knows of the others on the pool, and of its own standing."""

    admit_until: float = math.inf  # this replica's admission Lease (fail closed past it)
    leading: bool | None = None  # holds the pool's leader Lease (None: not told yet)
    peers: tuple[PeerState, ...] = ()  # the others' membership Leases
    drain: tuple[int, str] = (0, "")  # the announcement in force: (epoch, target)
    announcing: str = ""  # the target this leader last wanted announced

    def note_leadership(self, leading: bool) -> bool:
        """Take the leader Lease's answer; True if it is the first since start-up."""
        first, self.leading = self.leading is None, leading
        return first


def announcement(m: PoolReader) -> str:
    """The drain target the leader's Lease should announce now ("" for none)."""
    if m.actuation is not Actuation.OWN or m.swap is None:
        return ""
    return m.swap.target or RELEASING


def track_announcement(fleet: Fleet, m: PoolReader) -> None:
    """When the leader wants another announcement, the one in force stops counting until the
    platform reports the new one written (an acknowledgement of the old epoch proves nothing
    once a rewrite may be on its way to the followers)."""
    want = announcement(m)
    if want != fleet.announcing:
        fleet.announcing = want
        if m.actuation is Actuation.OWN:
            fleet.drain = (fleet.drain[0], REWRITING)


def observe_announcement(fleet: Fleet, epoch: int, target: str) -> None:
    """Take the pool's announcement: epochs only grow, 0 means the Lease was recreated."""
    if epoch == 0 or epoch >= fleet.drain[0]:
        fleet.drain = (epoch, target)


def follower_admits(m: PoolReader, member: str) -> bool:
    """A follower admits to the resident only while neither the leader's status nor its drain
    announcement names another member, and it follows no swap to another member."""
    swap = m.swap
    return m.status.pending in ("", member) and m.drain[1] in ("", member) and \
        (swap is None or swap.target == member)


def live(m: PoolReader) -> list[PeerState]:
    """The peers whose counts are known."""
    return [p for p in m.peers if not p.lost]


def peer_demand(m: PoolReader) -> list[str]:
    """Own mode: members that live peers hold requests for (by identity, then member order).
    In llmkube mode each replica triggers for its own."""
    if m.actuation is not Actuation.OWN:
        return []
    wanted: list[str] = []
    for peer in live(m):
        wanted.extend(name for name in m.spec.members if peer.held.get(name, 0) > 0
                      and name not in wanted)
    return wanted


def peers_release_first(m: PoolReader) -> bool:
    """Live peers still hold requests for the member that just took the slot: they release
    them once they see the status name it; the next swap waits for that (a fairness window
    at most), or it would announce another target and hold them for good."""
    resident, bound = m.resident, m.spec.fairness_window or m.spec.swap_budget
    if m.actuation is not Actuation.OWN or not m.serving(resident) or \
            m.now - m.resident_since >= bound:
        return False
    return any(p.held.get(resident, 0) > 0 for p in live(m))


def peers_drained(m: PoolReader, members: list[str]) -> bool:
    """Every live peer obeys the announcement in force and has nothing in flight on ``members``
    (own mode; in llmkube mode LLMKube's reconciler and its idle probe guard the unload)."""
    peers = live(m)
    if not peers or m.actuation is not Actuation.OWN:
        return True
    epoch, target = m.drain
    if m.swap is None or epoch == 0 or target != announcement(m):
        return False  # not announced yet (or the announcement is being rewritten)
    return all(p.acked == epoch and not any(p.in_flight.get(name, 0) for name in members)
               for p in peers)


def unsettled(m: PoolReader, now: float) -> bool:
    """A lost peer may still have requests streaming: only the idle probe or time can tell."""
    wait = m.limits.lost_replica_wait
    return any(p.lost and now < p.silent_since + wait for p in m.peers)


def settle_times(m: PoolReader) -> list[float]:
    """When lost peers stop counting (deadlines for the machine's timer)."""
    wait = m.limits.lost_replica_wait
    return [p.silent_since + wait for p in m.peers if p.lost]


def unavailable_message() -> str:
    """What a client hears from a replica that cannot renew its membership Lease."""
    return ("this model router replica cannot reach the Kubernetes API and stops routing "
            "until it can; retry (another replica serves)")
