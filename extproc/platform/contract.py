"""The one contract between the runtime and a platform (Kubernetes, or a static pools file).

Two directions, two Protocols:

* ``PoolListener`` is what a platform reports to: the runtime's ``Hub`` implements it. Its
  calls are synchronous and quick (a dictionary update and a policy step), so a watch can
  call them inline.
* ``Platform`` is what the runtime asks of a platform: watch and report (``run``), say when
  the first full picture is in (``synced``), carry out the policy's commands (``scale``,
  ``trigger``, ``probe_idle``), keep the pool's status (``publish``), tell operators
  (``notify``), and coordinate with the other replicas (``announce``, ``load_changed``,
  ``leave``; a platform without replicas does nothing there and reports no peers).

Both implementations (``static.StaticPlatform``, ``kube.platform.KubePlatform``) implement
``Platform`` exactly; nothing in the runtime or ``app.py`` asks which one it has.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from ..policy.events import Notice
from ..policy.model import MemberObservation, PoolKey, PoolSpec, PoolStatus, PoolView, StartHints


class WriteRefused(Exception):
    """A ``scale`` that certainly changed nothing: never sent, or the API server refused it."""


@dataclasses.dataclass(frozen=True)
class PoolLoad:
    """One replica's counts for one pool: the drain epoch it obeys, in flight and held by member."""

    acked: int = 0
    in_flight: Mapping[str, int] = dataclasses.field(default_factory=dict)
    held: Mapping[str, int] = dataclasses.field(default_factory=dict)


# A pool a replica's counts leave out: none in flight, held or acknowledged.
IDLE_LOAD = PoolLoad()


@dataclasses.dataclass(frozen=True)
class Peer:
    """Another replica as last read: ``pools`` (key ``<namespace>/<pool>``) is None when it
    is lost or its Lease unreadable. ``silent_since``: our monotonic clock's time when its
    Lease last changed."""

    identity: str
    lease_name: str
    lost: bool
    silent_since: float
    pools: Mapping[str, PoolLoad] | None
    scopes: tuple[str, ...] = ()  # the namespaces it watches (none: every namespace)


class PoolListener(Protocol):
    """Receives pools and member observations from a platform."""

    def pool_changed(self, spec: PoolSpec, hints: StartHints) -> None:
        """A pool appeared or its spec changed; ``hints`` seed a new pool's machine."""

    def pool_removed(self, key: PoolKey) -> None:
        """A pool was deleted."""

    def member_changed(self, key: PoolKey, obs: MemberObservation) -> None:
        """A member's observation changed (also sent once per member after pool_changed)."""

    def endpoints_changed(self, key: PoolKey, member: str, endpoints: tuple[str, ...]) -> None:
        """The member's Ready pods as ``ip:port`` changed (read by --endpoint-picker only)."""

    def status_changed(self, key: PoolKey, status: PoolStatus) -> None:
        """The pool's ``.status`` changed (also sent once right after pool_changed)."""

    def admission_changed(self, until: float) -> None:
        """This replica may admit until ``until`` (monotonic clock; its membership Lease)."""

    def leadership_changed(self, key: PoolKey, leading: bool) -> None:
        """This replica gained or lost the pool's leader Lease."""

    def peers_changed(self, peers: Sequence[Peer]) -> None:
        """The other replicas' membership Leases changed (or one turned lost)."""

    def drain_announced(self, key: PoolKey, epoch: int, target: str) -> None:
        """The pool's drain announcement in force: the leader's once written, others' seen."""

    def replica_load(self) -> Mapping[str, PoolLoad]:
        """This replica's counts per pool key, for its membership Lease."""


@dataclasses.dataclass(frozen=True, slots=True)
class CarryResult:
    """What one prompt-cache save or restore of a member's slots did (policy/carry.py)."""

    ok: bool  # it took effect (a restore: some tokens restored)
    detail: str  # what it did, or why not
    tokens: int = 0  # n_saved / n_restored over the member's slots
    slots: int = 0  # slots saved / restored


class Platform(Protocol):
    """What the runtime needs from the platform layer."""

    @property
    def synced(self) -> asyncio.Event:
        """Set once the first full picture of every pool and member has been reported."""

    @property
    def elects(self) -> bool:
        """Whether each pool elects a leader among replicas (its machine follows until then)."""

    async def run(self, listener: PoolListener) -> None:
        """Report pools and members to ``listener`` until cancelled."""

    async def stop(self, clean: bool = True) -> None:
        """Finish or drop background work and close connections (after ``run`` ends);
        ``clean`` False: streams were cut, so the membership is left to lapse, not ended."""

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Set a member's replicas: one attempt, raising on failure (the runtime retries);
        ``WriteRefused`` (or a subclass) when the write certainly changed nothing."""

    async def trigger(self, key: PoolKey, member: str) -> None:
        """llmkube mode: ``spec.replicas`` 0 -> 1 of ``member`` and nothing else, guarded by the
        resourceVersion last seen; done (no call) if the member already has replicas. One
        attempt, raising on failure or conflict (the runtime retries on a fresher view)."""

    async def probe_idle(self, key: PoolKey, member: str) -> bool | None:
        """Ask a member's runtime whether it is idle: True, False (busy), None (cannot tell)."""

    async def carry_slots(self, key: PoolKey, member: str, step: str) -> CarryResult:
        """Save (``step`` "save") or restore ("restore") the prompt cache of every slot of
        ``member``'s llama.cpp server; never raises for the server's answer, only reports."""

    def publish(self, view: PoolView) -> None:
        """Make the pool's status reflect ``view`` (non-blocking, latest wins)."""

    def notify(self, key: PoolKey, notice: Notice) -> None:
        """Tell operators about a swap event (non-blocking, best effort)."""

    def announce(self, key: PoolKey, target: str) -> None:
        """The pool's leader wants ``target`` announced to the other replicas ("" for none)."""

    def load_changed(self, urgent: bool) -> None:
        """This replica's counts changed in a way peers wait for: publish them soon (``urgent``:
        a swap waits on it, an acknowledged epoch or a drained member; else coalesced)."""

    async def leave(self) -> None:
        """Shutting down: hand leadership over now; stop() ends membership later."""
