"""Several replicas of this service, coordinated through Leases (docs/design/replicas.md).

Theory of operation:
- ``start()`` writes this replica's membership Lease before the watcher reads any pool
  state, so no peer can miss a replica that is already admitting.
- Every landed renew moves the admission Lease (``admission_changed``): past it the pools
  admit nothing. A replica whose renews lapsed had a blind cache: once a renew lands again,
  every watch re-lists first, and only then is admission reported again.
- In own and auto mode one ``LeaderLease`` for the whole replica set: its holder's machines
  lead every pool, the others follow (``leadership_changed``). The leader's drain
  announcements ride in that Lease, one entry per pool draining; each is told to the leader's
  own machine once written and in force, and to followers through one watch on every Lease of
  the service (member and leader roles), which also brings the peers' counts within a round
  trip instead of a renew period. Nothing here is per pool at rest: one renew, one watch.
- Writes for a pool are fenced (``leads``): a replica that is not the pool's leader, by its
  own clock, sends no scale and no status patch; what it sent before that carries a
  resourceVersion precondition, and the next leader's stamps refuse it (``fencing.py``).
- ``leave()`` on SIGTERM releases the leader Lease at once; ``stop()`` deletes the
  membership Lease after the streams have ended, so peers stop waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any
from pathlib import Path

from extproc.logs import get_logger
from extproc.platform.contract import PoolListener
from extproc.platform.kube.leader import LEADER_ROLE, LeaderLease, announcements_of, \
    worth_telling
from extproc.platform.kube.leases import Lease, LeaseClient
from extproc.platform.contract import Peer
from extproc.names import ROLE_LABEL
from extproc.platform.kube.membership import MEMBER_ROLE, Load, Membership
from extproc.platform.kube.rest import KubeClient
from extproc.platform.kube.watchloop import CollectionWatch
from extproc.policy.model import PoolKey, PoolSpec, StartHints
from extproc.settings import Settings

log = get_logger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def replica_identity(settings: Settings, environ: Mapping[str, str] | None = None) -> str:
    """--replica-name, else $POD_NAME, else the host name (a pod's name), lower-cased."""
    environ = os.environ if environ is None else environ
    return (settings.replica_name or environ.get("POD_NAME") or socket.gethostname()).lower()


def lease_namespace(settings: Settings, environ: Mapping[str, str] | None = None,
                    account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """--lease-namespace, else $POD_NAMESPACE, else the service account's, else default."""
    environ = os.environ if environ is None else environ
    if settings.lease_namespace or environ.get("POD_NAMESPACE"):
        return settings.lease_namespace or environ["POD_NAMESPACE"]
    with contextlib.suppress(OSError):
        return account_file.read_text().strip() or "default"
    return "default"


class Replicas:
    """This replica's membership, its leader candidacy, and the Lease watch, for one listener."""

    def __init__(self, client: KubeClient, settings: Settings,
                 relist: Callable[[], asyncio.Event], *,
                 clock: Callable[[], float] = time.monotonic,
                 on_lead: Callable[[PoolKey, bool], None] = lambda key, leading: None) -> None:
        self.identity = replica_identity(settings)
        self.namespace = lease_namespace(settings)
        self._client, self._settings, self._relist, self._clock = client, settings, relist, clock
        self._on_lead = on_lead  # the platform fences the pool's members on each gain
        self.membership = Membership(client, self.namespace, self.identity, self._load,
                                     settings, clock=clock, on_renew=self._renewed,
                                     lists_peers=False)  # the Lease watch brings them
        self._elects = settings.actuation != "llmkube"  # llmkube mode: any replica triggers
        self.leader = LeaderLease(client, self.namespace, self.identity, settings, clock=clock,
                                  floor=self._highest_ack)
        self._pools: dict[str, PoolKey] = {}  # the pools seen, by "<namespace>/<pool>"
        self._lead_since: dict[PoolKey, float] = {}
        self._leading = False  # as last told to the machines
        self._task: asyncio.Task[None] | None = None
        self._listener: PoolListener | None = None
        self._until = -math.inf  # the admission Lease last reported
        self._recovering = False
        self._peers_told: tuple[Peer, ...] | None = None
        self.listed = asyncio.Event()  # the Lease watch's first list is in
        self._told: dict[str, tuple[int, str]] = {}  # announcements told to the machines
        self._holder_told = ""  # the leader Lease's holder when the machines were last told

    async def start(self) -> None:
        """Write the membership Lease (retrying until it lands); call before any watch."""
        await self.membership.start()
        self._until = self.membership.valid_until
        log.info("membership lease held", lease=self.membership.name, namespace=self.namespace,
                 replica=self.identity)

    def attach(self, inner: PoolListener) -> PoolListener:
        """The listener the watcher should report to: ``inner``, with each pool's election.

        Nothing is admitted until the Lease watch has listed once: before that this replica
        does not know the drain announcements already in force.
        """
        self._listener = inner
        inner.admission_changed(-math.inf)
        return _Electing(inner, self)

    async def run(self) -> None:
        """Watch the service's Leases and age the peers, until cancelled."""
        watch = CollectionWatch(self._client, "leases", LeaseClient(self._client,
                                self.namespace).collection(), self._settings,
                                params={"labelSelector": ROLE_LABEL}, scope=self.namespace,
                                on_list=self._listed, on_event=self._event)
        async with asyncio.TaskGroup() as group:
            group.create_task(watch.run())
            group.create_task(self._age_peers())
            if self._elects:
                self._task = group.create_task(self.leader.run(
                    on_change=self._lead_all, on_rest=self._tell_pool))

    def leads(self, key: PoolKey) -> bool:
        """Whether this replica may write for ``key`` now (always in llmkube mode)."""
        return not self._elects or (str(key) in self._pools and self.leader.is_leader())

    def judges(self, key: PoolKey) -> bool:
        """Whether a foreign status write is ours to notice: we lead, and long enough that a
        write the previous leader had in flight when it let go is behind us (a deposed leader
        stopped writing a lease duration before; one that released its Lease, one round trip
        before: a retry period covers it and its watch lag)."""
        since = self._lead_since.get(key)
        return self.leads(key) and (not self._elects or (
            since is not None and self._clock() - since > self._settings.leader_retry))

    def announce(self, key: PoolKey, target: str) -> None:
        """The pool's machine wants ``target`` announced (leader only; others ignore it)."""
        if self._elects and str(key) in self._pools:
            self.leader.announce(str(key), target)

    def load_changed(self, urgent: bool) -> None:
        """Publish the counts soon (coalesced by the membership unless ``urgent``)."""
        self.membership.request_write(urgent)

    async def leave(self) -> None:
        """SIGTERM: our machines follow from now on, then the leader Lease is given up."""
        if self._task is not None:
            self._task.cancel()  # bounded: a shutdown must go on even if it did not end in time
            await asyncio.wait([self._task], timeout=self._settings.leader_retry)
            self._task = None
        if self._leading:
            self._lead_all(False)  # before the release: a new leader may act at once
        await self.leader.release()

    async def stop(self, clean: bool = True) -> None:
        """After the streams ended: release what is still held, delete the membership Lease
        (``clean``), or leave it to lapse when streams were cut (membership.stop)."""
        await self.leave()
        await self.membership.stop(delete=clean)

    # ---- pools (through _Electing) ---------------------------------------------------------

    def pool_seen(self, key: PoolKey) -> None:
        """A pool to lead while we hold the leader Lease (own and auto mode)."""
        if not self._elects or str(key) in self._pools:
            return
        self._pools[str(key)] = key
        self.leader.add_pool(str(key))
        if self._leading:
            self._lead(key, True)

    def pool_gone(self, key: PoolKey) -> None:
        """A pool went away: its announcement ends with the leader's next write."""
        if self._pools.pop(str(key), None) is None:
            return
        self.leader.remove_pool(str(key))
        self._lead_since.pop(key, None)
        self._told.pop(str(key), None)

    # ---- reports -----------------------------------------------------------------------------

    def _lead(self, key: PoolKey, leading: bool) -> None:
        log.debug("pool leadership " + ("taken" if leading else "lost"), namespace=key.namespace,
                  pool=key.name, replica=self.identity)
        if leading:
            self._lead_since[key] = self._clock()
        else:
            self._lead_since.pop(key, None)
        self._on_lead(key, leading)  # before the machine hears it: its first scale waits on it
        if self._listener is not None:
            self._listener.leadership_changed(key, leading)

    def _lead_all(self, leading: bool) -> None:
        self._leading = leading
        log.info("leadership " + ("taken" if leading else "lost"), replica=self.identity,
                 pools=len(self._pools))
        for key in list(self._pools.values()):
            self._lead(key, leading)

    def _tell_pool(self, pool: str, epoch: int, target: str) -> None:
        key = self._pools.get(pool)
        if key is not None:
            self._tell(key, epoch, target)

    def _tell(self, key: PoolKey, epoch: int, target: str) -> None:
        self._told[str(key)] = (epoch, target)
        if self._listener is not None:
            log.debug("drain announcement in force", namespace=key.namespace, pool=key.name,
                      epoch=epoch, target=target)
            self._listener.drain_announced(key, epoch, target)

    def _highest_ack(self) -> int:
        """The highest epoch a peer acknowledged: a recreated Lease's counter starts above it,
        so no stale acknowledgement can match a new announcement."""
        return max((load.acked for peer in self.membership.peers() if peer.pools
                    for load in peer.pools.values()), default=0)

    def _load(self) -> Load:
        return Load(self._listener.replica_load() if self._listener is not None else {})

    def _renewed(self) -> None:
        until = self.membership.valid_until
        if until == self._until or self._recovering:
            return  # not landed (the old Lease runs out on its own), or a re-list is under way
        if self._until <= self._clock():
            # Admission lapsed before this renew landed (sent late, or answered late): the
            # watches were as cut off as the renews and may have missed anything. Re-list.
            self._recovering = True
            log.warning("membership renewed after a lapse; re-listing before admitting again",
                        lease=self.membership.name)
            asyncio.get_running_loop().create_task(self._recover(self._relist()))
            return
        self._report_until(until)

    async def _recover(self, fresh: asyncio.Event) -> None:
        await fresh.wait()
        self._recovering = False
        self._report_until(self.membership.valid_until)
        log.info("cache re-listed; admitting again", lease=self.membership.name)

    def _report_until(self, until: float) -> None:
        self._until = until
        if self._listener is not None and self.listed.is_set():
            self._listener.admission_changed(until)

    def _listed(self, items: list[dict]) -> None:
        leases = [Lease.from_object(item) for item in items]
        self.membership.keep_only({lease.name for lease in leases})
        if self._elects and not any(lease.name == self.leader.name for lease in leases):
            self._leader_seen(None)  # none, or deleted while we were not watching
        for lease in leases:
            self._apply(lease, deleted=False)
        self._report_peers()
        if not self.listed.is_set():
            self.listed.set()
            self._report_until(self.membership.valid_until)

    def _event(self, kind: str, obj: dict) -> None:
        self._apply(Lease.from_object(obj), deleted=kind == "DELETED")
        self._report_peers()

    def _apply(self, lease: Lease, *, deleted: bool) -> None:
        role = lease.labels.get(ROLE_LABEL)
        if role == MEMBER_ROLE:
            self.membership.observe(lease, deleted)
        elif role == LEADER_ROLE and lease.name == self.leader.name and self._elects:
            self._leader_seen(None if deleted else lease)

    def _leader_seen(self, lease: Lease | None) -> None:
        """The leader Lease changed: the candidacy hears it; the machines hear each pool's
        announcement that changed (ours once in force, another holder's at once)."""
        self.leader.observe(lease)
        if self._listener is None:
            return
        holder = lease.holder if lease is not None else ""
        # a new holder: every pool hears what is in force once (a machine that was leading
        # may still wait for an announcement of its own), then only what changed for it
        changed, self._holder_told = holder != self._holder_told, holder
        if holder == self.identity:
            for news in self.leader.news():  # our own write came through the watch
                self._tell_pool(*news)
            return
        announced = announcements_of(lease)
        for pool in sorted(set(announced.drains) | set(self._told) | set(self._pools)):
            now = announced.of(pool)
            before = self._told.get(pool, (0, ""))
            if before != now and (changed or worth_telling(before, now)):
                namespace, _, name = pool.partition("/")
                self._tell(self._pools.get(pool) or PoolKey(namespace, name), *now)

    async def _age_peers(self) -> None:
        while True:  # a silent peer turns lost without any event: look twice a renew period
            await asyncio.sleep(self._settings.membership_renew / 2)
            self._report_peers()

    def _report_peers(self) -> None:
        peers = tuple(self.membership.peers())
        if peers != self._peers_told and self._listener is not None:
            self._peers_told = peers
            self._listener.peers_changed(peers)


class _Electing:
    """Forwards the watcher's reports, adding and removing each pool from the lead."""

    def __init__(self, inner: PoolListener, replicas: Replicas) -> None:
        self._inner, self._replicas = inner, replicas

    def pool_changed(self, spec: PoolSpec, hints: StartHints) -> None:
        """A pool appeared or changed: led by the leader Lease's holder too."""
        self._inner.pool_changed(spec, hints)
        self._replicas.pool_seen(spec.key)

    def pool_removed(self, key: PoolKey) -> None:
        """A pool went away: so does its lead."""
        self._replicas.pool_gone(key)
        self._inner.pool_removed(key)

    def __getattr__(self, name: str) -> Any:  # Any: it stands for every PoolListener report
        return getattr(self._inner, name)  # the other reports pass through unchanged
