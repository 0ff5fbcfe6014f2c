"""The replica set's leader Lease: which replica decides and actuates every pool's swaps.

One Lease for the whole replica set, as kube-controller-manager runs its controllers on one:
its holder leads every pool this service serves, so what the API server pays at rest does
not grow with the pools. The rules are client-go's leader election, on asyncio and
`time.monotonic()`:
- A free Lease (none, or no holder: released) is taken at once.
- A held one is taken only after it has not changed for a full `leaseDurationSeconds` measured
  on *our* clock from when *we* saw it change, so clock skew between replicas does not matter.
  The Lease watch (``replicas.py``) brings every change (``observe``): a candidate sends nothing
  while the holder renews, and tries once when the Lease has been silent a full duration.
- The holder renews every `leader_retry` from the version its last write was answered with (no
  read first); it counts itself leader only while its last successful renew was *sent* less
  than `leader_renew_deadline` ago (shorter than the duration, so it stops acting before any
  candidate may take over).
- Every write carries the resourceVersion read: of two candidates one wins, the other gets
  `LeaseConflict` and reads the Lease again. The transitions count is the leader term.
Leadership alone is not fencing: a deposed leader's writes must carry preconditions too.

The Lease also carries the drain announcement of every pool draining (``policy/replicas.py``):
``{"counter": c, "drains": {"<namespace>/<pool>": [epoch, target]}}`` in its payload
annotation. Every change of announcement takes the next value of the one counter: a new
target is written under it; an ended one loses its entry, and a pool with no entry reads as
(counter, "") -- a newer epoch than any it had, as the policy requires of an announcement
that ends. So a pool's epochs only grow, across leaders too (a new holder continues from the
counter it read), and the payload holds only the pools draining. New announcements are
written with the renew, or at once when asked (``announce``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from extproc.backoff import Backoff
from extproc.logs import get_logger
from extproc.platform.kube._calls import describe
from extproc.platform.kube.leases import Lease, LeaseClient, LeaseConflict, micro_time
from extproc.names import ROLE_LABEL
from extproc.platform.kube.membership import FAILURES
from extproc.platform.kube.rest import KubeClient
from extproc.settings import Settings

log = get_logger(__name__)

LEADER_ROLE = "leader"
_OWN_WRITES = 32  # our answered versions the watch may still be behind on


class Announcements(NamedTuple):
    """The drain announcements in a leader Lease."""

    counter: int
    drains: dict[str, tuple[int, str]]

    def of(self, pool: str) -> tuple[int, str]:
        """The pool's (epoch, target): its entry, else (counter, "")."""
        return self.drains.get(pool, (self.counter, ""))


def worth_telling(before: tuple[int, str] | None, now: tuple[int, str]) -> bool:
    """Whether a pool's machine must hear its announcement ``now``, having heard ``before``.

    Not when only the Lease's counter moved under a pool that has no announcement (another
    pool's swap wrote it): that tells the machine nothing, and told to every pool it made
    each swap cost work in every other pool. A new target, or a recreated Lease (epoch 0),
    is always told."""
    if before == now:
        return False
    return before is None or before[1] != "" or now[1] != "" or now[0] == 0


def announcements_of(lease: Lease | None) -> Announcements:
    """The announcements of a leader Lease (none: counter 0); malformed entries are skipped."""
    payload = lease.payload if lease is not None and isinstance(lease.payload, dict) else {}
    raw = payload.get("drains")
    drains: dict[str, Any] = raw if isinstance(raw, dict) else {}
    result: dict[str, tuple[int, str]] = {}
    for pool, entry in drains.items():
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int) and \
                not isinstance(entry[0], bool) and entry[0] > 0 and isinstance(entry[1], str):
            result[pool] = (entry[0], entry[1])
    counter = payload.get("counter")
    counter = counter if isinstance(counter, int) and counter >= 0 else 0
    return Announcements(max([counter, *(epoch for epoch, _ in result.values())]), result)


class LeaderLease:
    """This replica's candidacy for the replica set's leader Lease, and the pools it leads."""

    def __init__(self, client: KubeClient, namespace: str, identity: str, settings: Settings, *,
                 clock: Callable[[], float] = time.monotonic,
                 floor: Callable[[], int] = lambda: 0) -> None:
        self.leases = LeaseClient(client, namespace)
        self.name = settings.leader_lease_name
        self.identity = identity
        self.duration = int(settings.leader_lease_duration)
        self.renew_deadline = settings.leader_renew_deadline
        self.retry = settings.leader_retry
        self._api_retry = settings.api_retry_initial
        self._failed = False  # the last attempt's API call failed (not: the Lease is another's)
        self.epoch = -1  # leaseTransitions while we hold it: the leader term
        self._clock = clock
        self._floor = floor  # the highest epoch a peer acknowledged (a recreated Lease's counter)
        self._observed: Lease | None = None
        self._observed_at = -math.inf
        self._stale = True  # read the Lease before the next write (none observed, or a 409)
        self._own: list[str] = []  # versions our writes were answered with, oldest first
        self._renewed_sent = -math.inf
        self.announced = Announcements(0, {})  # in the Lease as last read or written
        self.desired: dict[str, str] = {}  # pool -> the target its machine wants ("" omitted)
        self.pools: set[str] = set()  # the pools this replica serves (others' entries end)
        self._told: dict[str, tuple[int, str]] = {}  # announcements last reported at rest
        self.seen: Announcements | None = None  # ours, as our watch last showed it
        self._wake = asyncio.Event()
        self.lapsed = False  # the last landed write came after our lead had run out

    def is_leader(self) -> bool:
        """Whether we may act as leader now (renewed within the renew deadline)."""
        return (self._observed is not None and self._observed.holder == self.identity
                and self._clock() < self._renewed_sent + self.renew_deadline)

    def add_pool(self, pool: str) -> None:
        """A pool this replica serves (its announcement is kept while its machine wants it)."""
        self.pools.add(pool)

    def remove_pool(self, pool: str) -> None:
        """A pool gone: its entry ends with the next write."""
        self.pools.discard(pool)
        self.desired.pop(pool, None)
        self._told.pop(pool, None)

    def observe(self, lease: Lease | None) -> None:
        """The Lease as the watch shows it (None: deleted); wakes the loop when it changed."""
        if lease is None:
            self._observed, self._observed_at, self._stale = None, self._clock(), True
            self._wake.set()
            return
        if lease.resource_version in self._own[:-1]:
            return  # an older write of ours, behind the answer we already hold
        if lease.holder == self.identity:
            self.seen = announcements_of(lease)
        self._take(lease, self._clock())
        self._wake.set()

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: take the Lease if free or silent a full duration, renew it if ours."""
        sent = self._clock()
        self._failed = True
        try:
            if self._stale:
                lease = await self.leases.get(self.name)
                if lease is None:
                    return self._landed(await self.leases.create(
                        self.name, holder=self.identity, duration_seconds=self.duration,
                        labels={ROLE_LABEL: LEADER_ROLE}, payload=self._payload(None)), sent)
                self._take(lease, sent)
            lease = self._observed
            assert lease is not None
            if lease.holder not in ("", self.identity) and \
                    sent < self._observed_at + lease.duration_seconds:
                self._failed = False
                return False  # held by another, and not silent for a full duration yet
            return self._landed(await self._write(lease), sent)
        except FAILURES as exc:
            if isinstance(exc, LeaseConflict) or getattr(exc, "status", 0) == 404:
                self._stale = True  # someone wrote it (or deleted it): read it again
            log.info("leader lease not renewed", lease=self.name, error=describe(exc))
            return False

    def _landed(self, lease: Lease, sent: float) -> bool:
        # Landed after our lead had run out by our clock (a slow answer): writes were refused
        # meanwhile, so the term is reported as lost and taken again (``run``).
        self.lapsed = self._renewed_sent > -math.inf and \
            self._clock() >= self._renewed_sent + self.renew_deadline
        self._failed = False
        self._own = [*self._own[-_OWN_WRITES:], lease.resource_version]
        self._take(lease, sent)
        self._renewed_sent = sent
        self.epoch = lease.transitions
        return True

    def announce(self, pool: str, target: str) -> None:
        """Have ``target`` announced for ``pool`` (a new epoch) with the next write, made now."""
        if target != self.desired.get(pool, ""):
            if target:
                self.desired[pool] = target
            else:
                self.desired.pop(pool, None)
            self._told.pop(pool, None)  # the machine forgot the one in force: tell it again
            self._wake.set()

    def at_rest(self, pool: str) -> bool:
        """We lead and the Lease announces what the pool's machine wants."""
        return self.is_leader() and self.announced.of(pool)[1] == self.desired.get(pool, "")

    def news(self, pools: Iterable[str] | None = None) -> list[tuple[str, int, str]]:
        """Each pool's announcement, once, when it is in force: at rest, and our Lease watch has
        shown it, so every Lease event before it (a peer that joined) has reached us too."""
        if self.seen is None or not self.is_leader():
            return []
        out = []
        for pool in sorted(self.pools if pools is None else pools):
            now = self.announced.of(pool)
            if self.at_rest(pool) and self.seen.of(pool) == now and \
                    worth_telling(self._told.get(pool), now):
                self._told[pool] = now
                out.append((pool, *now))
        return out

    def _next_try(self) -> float:
        """A retry period while we hold it or know nothing; else when the holder's Lease has
        been silent a full duration (the watch wakes us sooner if it changes)."""
        lease = self._observed
        if lease is not None and not self._stale and lease.holder == "":
            return 0.0  # released: take it now
        if lease is None or self._stale or lease.holder == self.identity:
            return self.retry
        return max(0.0, self._observed_at + lease.duration_seconds - self._clock()) + 0.01

    def _payload(self, lease: Lease | None) -> dict[str, object]:
        counter, announced = announcements_of(lease)
        counter = max(counter, self.announced.counter)
        drains: dict[str, list[object]] = {}
        bumped = False
        for pool in sorted(set(announced) | (set(self.desired) & self.pools)):
            want = self.desired.get(pool, "") if pool in self.pools else ""
            epoch, target = announced.get(pool, (0, ""))
            if want == target:
                drains[pool] = [epoch, target]
                continue
            if not bumped or want:  # endings share one new value, each new target its own
                counter, bumped = max(counter, self._floor()) + 1, True
            if want:
                drains[pool] = [counter, want]
        return {"counter": counter, "drains": drains}

    async def _write(self, lease: Lease) -> Lease:
        if lease.holder == self.identity:
            return await self.leases.renew(lease, holder=self.identity,
                                           duration_seconds=self.duration,
                                           payload=self._payload(lease))
        log.info("taking leader lease", lease=self.name, previous=lease.holder or "(released)")
        return await self.leases.renew(lease, holder=self.identity, duration_seconds=self.duration,
                                       transitions=lease.transitions + 1,
                                       acquire_time=micro_time(), payload=self._payload(lease))

    def _take(self, lease: Lease, now: float) -> None:
        if self._observed is None or self._observed.resource_version != lease.resource_version:
            self._observed, self._observed_at = lease, now
        self._stale = False
        self.announced = announcements_of(lease)

    async def run(self, on_change: Callable[[bool], None] = lambda leader: None,
                  on_rest: Callable[[str, int, str], None] = lambda pool, epoch, target: None
                  ) -> None:
        """Renew every `leader_retry` while leading (at once after `announce`), try to take
        over when the holder fell silent, until cancelled; `on_change` hears each gain and
        loss, `on_rest` each pool's announcement once in force."""
        leading = False
        # A failed attempt waits out this backoff (up to one retry period) before the next: a
        # leader whose announcement did not land is not at rest, and retrying it at once was a
        # hot loop for as long as the API refused.
        backoff = Backoff(self._api_retry, self.retry)
        while True:
            self._wake.clear()
            wanted = dict(self.desired)
            # One attempt may not outlast the renew deadline (client-go's bound too).
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
            # meets the inner call's end, and this loop must stop when cancelled (leave()).
            renewed = False
            try:
                async with asyncio.timeout(self.renew_deadline):
                    renewed = await self.try_acquire_or_renew()
            except TimeoutError:
                log.info("leader lease attempt timed out", lease=self.name)
            if leading and self.lapsed:  # lost for a while by our clock: a new term
                leading = False
                on_change(False)
            if self.is_leader() != leading:
                leading = not leading
                on_change(leading)
            for news in self.news():
                on_rest(*news)
            if not self.is_leader():
                self._told.clear()  # a later lead tells its announcements afresh
            if renewed and self.desired != wanted and self.is_leader():
                continue  # an announcement changed while we wrote: write it now
            if not renewed and self._failed:
                await asyncio.sleep(min(self.retry, backoff.next_delay()))
                continue
            backoff.reset()
            await self._rest()

    async def _rest(self) -> None:
        """Wait for the next attempt: a renew's period, or a watch event that may change it."""
        deadline = self._clock() + self._next_try()
        while (left := deadline - self._clock()) > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()
            if not self._wake.is_set():
                return
            self._wake.clear()
            if self.is_leader():
                if any(self.desired.get(p, "") != self.announced.of(p)[1]
                       for p in self.pools | set(self.desired)):
                    return  # a new announcement to write
                continue
            deadline = min(deadline, self._clock() + self._next_try())

    async def release(self) -> None:
        """Give the Lease up if we hold it (holder emptied), so a candidate takes it at once."""
        lease, self._renewed_sent = self._observed, -math.inf
        if lease is None or lease.holder != self.identity:
            return
        with contextlib.suppress(*FAILURES):  # not released: it expires after its duration
            # client-go releases with a 1 s duration; an empty holder is what frees it here.
            # The announcements stay: the next leader continues from their counter.
            counter, drains = announcements_of(lease)
            self._observed = await self.leases.renew(
                lease, holder="", duration_seconds=1,
                payload={"counter": counter,
                         "drains": {pool: list(entry) for pool, entry in drains.items()}})
