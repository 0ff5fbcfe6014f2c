"""A pool's leader Lease: which replica decides and actuates that pool's swaps.

The rules are client-go's leader election, on asyncio and `time.monotonic()`:
- A free Lease (none, or no holder: released) is taken at once.
- A held one is taken only after it has not changed for a full `leaseDurationSeconds` measured
  on *our* clock from when *we* saw it change, so clock skew between replicas does not matter.
- The holder renews every `leader_retry`; it counts itself leader only while its last successful
  renew was *sent* less than `leader_renew_deadline` ago (shorter than the duration, so it stops
  acting before any candidate may take over).
- Every write carries the resourceVersion read: of two candidates one wins, the other gets
  `LeaseConflict`. The transitions count, bumped on each change of holder, is the epoch.
Leadership alone is not fencing: a deposed leader's writes must carry preconditions too.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable

from extproc.logs import get_logger
from extproc.platform.kube._calls import describe
from extproc.platform.kube.leases import Lease, LeaseClient, micro_time
from extproc.platform.kube.membership import FAILURES
from extproc.platform.kube.rest import KubeClient
from extproc.policy.model import PoolKey
from extproc.settings import Settings

log = get_logger(__name__)


class LeaderLease:
    """One candidate for one pool's leader Lease."""

    def __init__(self, client: KubeClient, namespace: str, pool: PoolKey, identity: str,
                 settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.leases = LeaseClient(client, namespace)  # the Leases' namespace, not the pool's
        self.pool = pool
        self.name = settings.leader_lease_name.format(namespace=pool.namespace, pool=pool.name)
        self.identity = identity
        self.duration = int(settings.leader_lease_duration)
        self.renew_deadline = settings.leader_renew_deadline
        self.retry = settings.leader_retry
        self.epoch = -1  # leaseTransitions of the Lease while we hold it
        self._clock = clock
        self._observed: Lease | None = None
        self._observed_at = -math.inf
        self._renewed_sent = -math.inf

    def is_leader(self) -> bool:
        """Whether we may act as this pool's leader now (renewed within the renew deadline)."""
        return (self._observed is not None and self._observed.holder == self.identity
                and self._clock() < self._renewed_sent + self.renew_deadline)

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: take the Lease if free or expired, renew it if ours; True if we hold it."""
        sent = self._clock()
        try:
            lease = await self.leases.get(self.name)
            if lease is None:
                lease = await self.leases.create(self.name, holder=self.identity,
                                                 duration_seconds=self.duration)
            else:
                self._observe(lease, sent)
                if lease.holder not in ("", self.identity) and \
                        sent < self._observed_at + lease.duration_seconds:
                    return False  # held by another, and not silent for a full duration yet
                lease = await self._write(lease)
        except FAILURES as exc:
            log.info("leader lease not renewed", lease=self.name, error=describe(exc))
            return False
        self._observe(lease, sent)
        self._renewed_sent = sent
        self.epoch = lease.transitions
        return True

    async def _write(self, lease: Lease) -> Lease:
        if lease.holder == self.identity:
            return await self.leases.renew(lease, holder=self.identity, duration_seconds=self.duration)
        log.info("taking leader lease", lease=self.name, previous=lease.holder or "(released)")
        return await self.leases.renew(lease, holder=self.identity, duration_seconds=self.duration,
                                       transitions=lease.transitions + 1, acquire_time=micro_time())

    def _observe(self, lease: Lease, now: float) -> None:
        if self._observed is None or self._observed.resource_version != lease.resource_version:
            self._observed, self._observed_at = lease, now

    async def run(self, on_change: Callable[[bool], None] = lambda leader: None) -> None:
        """Try every `leader_retry` seconds until cancelled; `on_change` hears each gain and loss."""
        leading = False
        while True:
            await self.try_acquire_or_renew()
            if self.is_leader() != leading:
                leading = not leading
                on_change(leading)
            await asyncio.sleep(self.retry)

    async def release(self) -> None:
        """Give the Lease up if we hold it (holder emptied), so a candidate takes it at once."""
        lease, self._renewed_sent = self._observed, -math.inf
        if lease is None or lease.holder != self.identity:
            return
        with contextlib.suppress(*FAILURES):  # not released: it expires after its duration
            # client-go releases with a 1 s duration; an empty holder is what frees it here
            self._observed = await self.leases.renew(lease, holder="", duration_seconds=1)
