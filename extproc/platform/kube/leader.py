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

The Lease also carries the pool's drain announcement (``policy/replicas.py``): ``{"pool",
"epoch", "target"}`` in its payload annotation. A new target is written under the next epoch,
with the renew or at once when asked (``announce``); epochs only grow, across leaders too,
since a new holder starts from the payload it read.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable

from extproc.backoff import Backoff
from extproc.logs import get_logger
from extproc.platform.kube._calls import describe
from extproc.platform.kube.leases import Lease, LeaseClient, lease_name, micro_time
from extproc.platform.kube.membership import FAILURES, ROLE_LABEL
from extproc.platform.kube.rest import KubeClient
from extproc.policy.model import PoolKey
from extproc.settings import Settings

log = get_logger(__name__)

LEADER_ROLE = "leader"


class LeaderLease:
    """One candidate for one pool's leader Lease."""

    def __init__(self, client: KubeClient, namespace: str, pool: PoolKey, identity: str,
                 settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.leases = LeaseClient(client, namespace)  # the Leases' namespace, not the pool's
        self.pool = pool
        self.name = lease_name(settings.leader_lease_name.format(namespace=pool.namespace,
                                                                 pool=pool.name))
        self.identity = identity
        self.duration = int(settings.leader_lease_duration)
        self.renew_deadline = settings.leader_renew_deadline
        self.retry = settings.leader_retry
        self._api_retry = settings.api_retry_initial
        self._failed = False  # the last attempt's API call failed (not: the Lease is another's)
        self.epoch = -1  # leaseTransitions of the Lease while we hold it
        self._clock = clock
        self._observed: Lease | None = None
        self._observed_at = -math.inf
        self._renewed_sent = -math.inf
        self.announced = (0, "")  # (epoch, target) in the Lease as last read or written
        self.desired = ""  # what our pool's machine wants announced
        self._told: tuple[int, str] | None = None  # the announcement last reported at rest
        self.seen = (0, "")  # our announcement as our own Lease watch last showed it
        self._wake = asyncio.Event()

    def is_leader(self) -> bool:
        """Whether we may act as this pool's leader now (renewed within the renew deadline)."""
        return (self._observed is not None and self._observed.holder == self.identity
                and self._clock() < self._renewed_sent + self.renew_deadline)

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: take the Lease if free or expired, renew it if ours; True if we hold it."""
        sent = self._clock()
        self._failed = True
        try:
            lease = await self.leases.get(self.name)
            if lease is None:
                lease = await self.leases.create(self.name, holder=self.identity,
                                                 duration_seconds=self.duration,
                                                 labels={ROLE_LABEL: LEADER_ROLE},
                                                 payload=self._payload())
            else:
                self._observe(lease, sent)
                if lease.holder not in ("", self.identity) and \
                        sent < self._observed_at + lease.duration_seconds:
                    self._failed = False
                    return False  # held by another, and not silent for a full duration yet
                lease = await self._write(lease)
        except FAILURES as exc:
            log.info("leader lease not renewed", lease=self.name, error=describe(exc))
            return False
        self._failed = False
        self._observe(lease, sent)
        self._renewed_sent = sent
        self.epoch = lease.transitions
        return True

    def announce(self, target: str) -> None:
        """Have ``target`` announced (a new epoch) with the next write, which is made now."""
        if target != self.desired:
            self.desired = target
            self._told = None  # the machine forgot the one in force: tell it again at rest
            self._wake.set()

    def at_rest(self) -> bool:
        """We lead and the Lease announces what our machine wants."""
        return self.is_leader() and self.announced[1] == self.desired

    def news(self) -> tuple[int, str] | None:
        """The announcement, once, when it is in force: at rest, and our Lease watch has shown
        it, so every Lease event before it (a peer that joined) has reached us too."""
        if not self.at_rest() or self.seen != self.announced or self._told == self.announced:
            return None
        self._told = self.announced
        return self.announced

    def _next_try(self) -> float:
        """A retry period, or less when another's Lease runs out sooner: try right then (a
        candidate on a fixed 2 s tick would take over up to 2 s after it could)."""
        lease = self._observed
        if lease is None or lease.holder in ("", self.identity):
            return self.retry
        expires = self._observed_at + lease.duration_seconds - self._clock()
        return min(self.retry, max(0.0, expires) + 0.01)

    def _payload(self) -> dict[str, object]:
        epoch, target = self.announced
        if self.desired != target:
            epoch, target = epoch + 1, self.desired
        return {"pool": str(self.pool), "epoch": epoch, "target": target}

    async def _write(self, lease: Lease) -> Lease:
        if lease.holder == self.identity:
            return await self.leases.renew(lease, holder=self.identity, duration_seconds=self.duration,
                                           payload=self._payload())
        log.info("taking leader lease", lease=self.name, previous=lease.holder or "(released)")
        return await self.leases.renew(lease, holder=self.identity, duration_seconds=self.duration,
                                       transitions=lease.transitions + 1, acquire_time=micro_time(),
                                       payload=self._payload())

    def _observe(self, lease: Lease, now: float) -> None:
        if self._observed is None or self._observed.resource_version != lease.resource_version:
            self._observed, self._observed_at = lease, now
        self.announced = announcement_of(lease)

    async def run(self, on_change: Callable[[bool], None] = lambda leader: None,
                  on_rest: Callable[[int, str], None] = lambda epoch, target: None) -> None:
        """Try every `leader_retry` seconds (at once after `announce`) until cancelled;
        `on_change` hears each gain and loss, `on_rest` each announcement once in force."""
        leading = False
        # A failed attempt waits out this backoff (up to one retry period) before the next: a
        # leader whose announcement did not land is not at rest, and retrying it at once was a
        # hot loop for as long as the API refused (thousands of calls in a 10 s outage).
        backoff = Backoff(self._api_retry, self.retry)
        while True:
            self._wake.clear()
            wanted = self.desired
            # One attempt may not outlast the renew deadline (client-go's bound too).
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
            # meets the inner call's end, and this loop must stop when cancelled (leave()).
            renewed = False
            try:
                async with asyncio.timeout(self.renew_deadline):
                    renewed = await self.try_acquire_or_renew()
            except TimeoutError:
                log.info("leader lease attempt timed out", lease=self.name)
            if self.is_leader() != leading:
                leading = not leading
                on_change(leading)
            if (news := self.news()) is not None:
                on_rest(*news)
            if not self.is_leader():
                self._told = None  # a later lead tells its announcement afresh
            if renewed and self.desired != wanted and self.is_leader():
                continue  # the announcement changed while we wrote: write it now
            # Only a failed call (the API unreachable, refusing, a conflict) backs off, and a
            # new announcement does not cut that wait short; a candidate refused because
            # another holds the Lease made a good attempt and waits as usual.
            if not renewed and self._failed:
                await asyncio.sleep(min(self._next_try(), backoff.next_delay()))
                continue
            backoff.reset()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_try()):
                    await self._wake.wait()

    async def release(self) -> None:
        """Give the Lease up if we hold it (holder emptied), so a candidate takes it at once."""
        lease, self._renewed_sent = self._observed, -math.inf
        if lease is None or lease.holder != self.identity:
            return
        with contextlib.suppress(*FAILURES):  # not released: it expires after its duration
            # client-go releases with a 1 s duration; an empty holder is what frees it here.
            # The announcement stays: the next leader continues from its epoch.
            self._observed = await self.leases.renew(
                lease, holder="", duration_seconds=1,
                payload={"pool": str(self.pool), "epoch": self.announced[0],
                         "target": self.announced[1]})


def announcement_of(lease: Lease) -> tuple[int, str]:
    """The (epoch, target) a leader Lease announces ((0, "") when none or unreadable)."""
    payload = lease.payload if isinstance(lease.payload, dict) else {}
    epoch, target = payload.get("epoch"), payload.get("target")
    if not isinstance(epoch, int) or epoch < 0 or not isinstance(target, str):
        return 0, ""
    return epoch, target
