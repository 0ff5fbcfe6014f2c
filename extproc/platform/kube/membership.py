"""A replica's membership Lease: proof to itself that it may admit, and its counts for the others.

Theory of operation (docs/design/replicas.md, "Membership"):
- `start()` creates the replica's own Lease before anything reads pool state, so no peer can
  miss a replica that is already admitting.
- The loop renews every `membership_renew` seconds with the current `Load` (in-flight and held
  counts per member) in the Lease's annotation, and writes at once when `request_write()` asks,
  coalesced to one write per `membership_write_interval`.
- `valid_until` is measured on this process's monotonic clock from when the last successful
  renew was *sent*, minus the margin: the API server may have stamped the renew later, never
  earlier, so a peer's view of the Lease expires no sooner than ours. Any failed renew (503,
  429 throttling, a transport error, a conflict) leaves it where it was.
- Peers are read after each renew. A peer whose Lease has not changed for its duration + margin,
  measured on our clock from when we saw it change, is lost: its counts are unknown, never zero.
  A deleted Lease is a clean leave and drops the peer at once.
- `stop()` deletes the Lease so the others stop waiting for it: a clean leave, for a replica
  whose streams all ended. One that cut streams still relayed by Envoy stops renewing and
  leaves the Lease to lapse: the others then count it lost, its counts unknown, and wait for
  the member's idle probe (or --lost-replica-wait) before unloading it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from extproc.backoff import Backoff
from extproc.logs import get_logger
from extproc.platform.contract import IDLE_LOAD, Peer, PoolLoad
from extproc.platform.kube._calls import TRANSPORT_ERRORS, describe
from extproc.platform.kube.leases import Lease, LeaseClient, LeaseConflict, lease_name
from extproc.platform.kube.rest import ApiError, KubeClient
from extproc.settings import Settings
from extproc.names import ROLE_LABEL

log = get_logger(__name__)

MEMBER_ROLE = "member"
FAILURES = (ApiError, LeaseConflict, *TRANSPORT_ERRORS)


def _counts(value: Any) -> dict[str, int] | None:
    if not isinstance(value, dict) or not all(isinstance(v, int) and v >= 0
                                              for v in value.values()):
        return None
    return value


@dataclasses.dataclass(frozen=True)
class Load:
    """What a replica publishes: a PoolLoad per pool key (``<namespace>/<pool>``)."""

    pools: Mapping[str, PoolLoad] = dataclasses.field(default_factory=dict)

    def to_payload(self) -> dict[str, Any]:
        """The JSON carried in the Lease annotation; a pool with nothing to count is left out
        (a reader takes a missing pool for zeros), so a fleet at rest writes a small Lease."""
        return {"pools": {key: {"acked": load.acked, "inFlight": dict(load.in_flight),
                                "held": dict(load.held)} for key, load in self.pools.items()
                          if load != IDLE_LOAD}}

    @classmethod
    def from_payload(cls, payload: Any) -> Load | None:
        """The Load in a peer's annotation, or None when it is missing or malformed (unknown)."""
        pools = payload.get("pools") if isinstance(payload, dict) else None
        if not isinstance(pools, dict):
            return None
        result = {}
        for key, entry in pools.items():
            if not isinstance(entry, dict):
                return None
            acked, in_flight, held = (entry.get("acked", 0), _counts(entry.get("inFlight")),
                                      _counts(entry.get("held")))
            if not isinstance(acked, int) or in_flight is None or held is None:
                return None
            result[key] = PoolLoad(acked, in_flight, held)
        return cls(result)


@dataclasses.dataclass
class _Sighting:
    lease: Lease
    changed_at: float  # our monotonic clock when its resourceVersion was first seen


def _incarnation(lease: Lease) -> str | None:
    payload = lease.payload if isinstance(lease.payload, dict) else {}
    value = payload.get("incarnation")
    return value if isinstance(value, str) else None


def _scopes(lease: Lease) -> tuple[str, ...]:
    payload = lease.payload if isinstance(lease.payload, dict) else {}
    value = payload.get("namespaces")
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


class Membership:
    """One replica's membership Lease, its renew loop and its view of the peers."""

    def __init__(self, client: KubeClient, namespace: str, identity: str, load: Callable[[], Load],
                 settings: Settings, *, clock: Callable[[], float] = time.monotonic,
                 on_renew: Callable[[], None] = lambda: None, lists_peers: bool = True) -> None:
        self.leases = LeaseClient(client, namespace)
        self.identity = identity
        self.name = lease_name(settings.membership_lease_name.format(replica=identity))
        self.duration = int(settings.membership_lease_duration)
        self.renew_every = settings.membership_renew
        self.margin = settings.lease_margin
        self.write_interval = settings.membership_write_interval
        # after a failed write: the next one within a renew period, sooner at first
        self._backoff = Backoff(settings.api_retry_initial, self.renew_every)
        self.valid_until = -math.inf
        self.failed_renews = 0
        self._load = load
        self._on_renew = on_renew  # after every attempt, landed or not
        # False when a Lease watch feeds observe(): listing after each renew would repeat it
        self._lists_peers = lists_peers
        self._clock = clock
        self._lease: Lease | None = None
        self._seen: dict[str, _Sighting] = {}
        # Each process is an incarnation: a pod restarted under the same name takes its Lease
        # back at once, but the dead process's routed streams may still flow (Envoy fails
        # open), so its counts become a lost "ghost" until the idle probe or the wait settles.
        self.incarnation = uuid.uuid4().hex[:12]
        self.lost_wait = settings.lost_replica_wait
        self.scopes = sorted(settings.namespaces)  # a peer never waits on pools we do not serve
        self._ghosts: dict[str, tuple[str, float]] = {}  # lease name -> (identity, silent since)
        self._wake = asyncio.Event()
        self._urgent = False
        self._last_attempt = -math.inf
        self._task: asyncio.Task[None] | None = None

    def is_valid(self) -> bool:
        """Whether this replica may admit: its last successful renew is recent enough."""
        return self._clock() < self.valid_until

    async def start(self) -> None:
        """Create (or take back) this replica's Lease, retrying until it is written, then renew on."""
        while not await self._renew():
            await asyncio.sleep(self._backoff.next_delay())
        self._backoff.reset()  # landed: the next failure starts from the shortest delay
        if self._lists_peers:
            await self._refresh_peers()
        self._task = asyncio.create_task(self._run(), name=f"membership {self.name}")

    def request_write(self, urgent: bool = False) -> None:
        """Publish the current Load soon (coalesced), not only at the next renew; ``urgent``
        (a swap waits for it: an acknowledged epoch, a drained member) skips the coalescing."""
        self._urgent = self._urgent or urgent
        self._wake.set()

    def peers(self) -> list[Peer]:
        """The other replicas' Leases as last listed, aged on our clock now."""
        now = self._clock()
        result = []
        for name, seen in sorted(self._seen.items()):
            lost = now - seen.changed_at > seen.lease.duration_seconds + self.margin
            load = None if lost else Load.from_payload(seen.lease.payload)
            result.append(Peer(seen.lease.holder, name, lost, seen.changed_at,
                               None if load is None else load.pools, _scopes(seen.lease)))
        for name, (identity, since) in list(self._ghosts.items()):
            if now - since > self.lost_wait:
                del self._ghosts[name]  # whatever it streamed has ended by now
            else:
                result.append(Peer(f"{identity} (previous run)", name, True, since, None))
        return result

    def _haunt(self, lease: Lease, since: float) -> None:
        """``lease`` carries another incarnation's counts than the one about to replace them."""
        if _incarnation(lease) is not None:
            self._ghosts[lease.name] = (lease.holder, since)

    def keep_only(self, names: set[str]) -> None:
        """Forget peers whose Lease is gone from a full list (deleted: they left cleanly)."""
        for name in [n for n in self._seen if n not in names]:
            del self._seen[name]

    def observe(self, lease: Lease, deleted: bool = False) -> None:
        """A peer's Lease as a watch saw it (a deleted one is a clean leave: dropped at once)."""
        if lease.name == self.name:
            return
        if deleted:
            self._seen.pop(lease.name, None)
            return
        seen = self._seen.get(lease.name)
        if seen is None or seen.lease.resource_version != lease.resource_version:
            if seen is not None and _incarnation(seen.lease) != _incarnation(lease):
                self._haunt(seen.lease, seen.changed_at)  # restarted: the old run is lost
            self._seen[lease.name] = _Sighting(lease, self._clock())

    async def stop(self, delete: bool = True) -> None:
        """Stop renewing and delete the Lease unless ``delete`` is False (a failure is
        logged: the Lease then expires)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.valid_until = -math.inf
        if not delete:
            log.warning("membership lease left to lapse: streams were cut", lease=self.name)
            return
        lease = self._lease
        try:
            with contextlib.suppress(LeaseConflict):
                if lease is not None:
                    await self.leases.delete(lease)
                    return
            # written since we last read it (a lost answer), or never read: delete what is there
            current = await self.leases.get(self.name)
            if current is not None and current.holder == self.identity:
                await self.leases.delete(current)
        except FAILURES as exc:
            log.warning("membership lease not deleted", lease=self.name, error=describe(exc))

    async def _run(self) -> None:
        retry_in, failing = self.renew_every, False
        while True:
            wait = self._last_attempt + retry_in - self._clock()
            with contextlib.suppress(TimeoutError):  # (asyncio.timeout: see leader.run)
                async with asyncio.timeout(max(0.0, wait)):
                    await self._wake.wait()
            early = self._wake.is_set()
            # An early write waits at least write_interval after the last attempt (urgent ones
            # not), and after a failed attempt every write, urgent too, waits out the backoff:
            # writes asked for during an outage must not turn into a loop against the API.
            spacing = retry_in if failing else 0.0 if self._urgent else self.write_interval
            if early:
                await asyncio.sleep(max(0.0, self._last_attempt + spacing - self._clock()))
            self._wake.clear()
            self._urgent = False
            failing = not await self._renew()
            if failing:
                retry_in = self._backoff.next_delay()
            else:
                self._backoff.reset()
                retry_in = self.renew_every
            self._on_renew()
            if not early and self._lists_peers:
                await self._refresh_peers()

    async def _renew(self) -> bool:
        """One write of the Lease with the current Load; True when it landed."""
        sent = self._last_attempt = self._clock()
        payload = {**self._load().to_payload(), "incarnation": self.incarnation,
                   "namespaces": self.scopes}
        try:
            if self._lease is None:
                self._lease = await self._create_or_take_back(payload)
            else:
                self._lease = await self.leases.renew(
                    self._lease, holder=self.identity, duration_seconds=self.duration, payload=payload)
        except FAILURES as exc:
            self.failed_renews += 1
            if isinstance(exc, LeaseConflict) or (isinstance(exc, ApiError) and exc.status == 404):
                self._lease = None  # re-read (or re-create) it on the next attempt
            log.warning("membership renew failed", lease=self.name, error=describe(exc),
                        valid_for=round(self.valid_until - self._clock(), 3))
            return False
        self.valid_until = max(self.valid_until, sent + self.duration - self.margin)
        return True

    async def _create_or_take_back(self, payload: dict[str, Any]) -> Lease:
        try:
            return await self.leases.create(self.name, holder=self.identity,
                                            duration_seconds=self.duration,
                                            labels={ROLE_LABEL: MEMBER_ROLE}, payload=payload)
        except LeaseConflict:
            # ours from a previous run of this pod, or a renew whose answer was lost
            current = await self.leases.get(self.name)
            if current is None:
                raise
            if _incarnation(current) != self.incarnation:
                self._haunt(current, self._clock())  # our previous run may still stream
            return await self.leases.renew(current, holder=self.identity,
                                           duration_seconds=self.duration, payload=payload)

    async def _refresh_peers(self) -> None:
        try:
            listed = await self.leases.list(f"{ROLE_LABEL}={MEMBER_ROLE}")
        except FAILURES as exc:
            # keep the last sightings: they age into "lost", which is the safe reading
            log.warning("membership peers not listed", error=describe(exc))
            return
        self.keep_only({lease.name for lease in listed})
        for lease in listed:
            self.observe(lease)
