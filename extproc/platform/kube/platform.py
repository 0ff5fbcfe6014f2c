"""The Platform in cluster mode: one object that owns the watcher, actuator, status
publisher, event recorder and idle-probe session, built from Settings.

It implements ``platform.contract.Platform``; the watcher reports straight to the runtime's
listener, so nothing here forwards observations.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from extproc.logs import get_logger
from extproc.platform.kube._calls import POOLS, SERVICES, TRANSPORT_ERRORS
from extproc.platform.kube.actuator import Actuator
from extproc.platform.kube.client import make_api_client
from extproc.platform.kube.recorder import EventRecorder
from extproc.platform.kube.idle import run_probe
from extproc.platform.kube.idle.slotcache import carry, slot_file
from extproc.platform.kube.coordination import Replicas
from extproc.platform.kube.fencing import HeldVersions, TakeoverFences
from extproc.platform.kube.rest import ApiError, KubeClient
from extproc.platform.kube.routecheck import RouteChecker
from extproc.platform.kube.status import StatusPublisher, StatusWriter
from extproc.platform.kube.turns import WriteTurns
from extproc.platform.kube.watcher import ClusterWatcher
from extproc.platform.contract import CarryResult, PoolListener, WriteRefused
from extproc.policy.events import Notice, is_warning
from extproc.policy.model import PoolKey, PoolView
from extproc.settings import Settings

log = get_logger(__name__)


class NotLeader(WriteRefused):
    """A write for a pool this replica does not lead (the runtime drops or retries it)."""


class ScaleRefused(ApiError, WriteRefused):
    """The API server answered a scale with a 4xx: nothing changed."""


class KubePlatform:
    """Watches the cluster for the runtime and carries out its scale, status and event calls."""

    def __init__(self, api_client: KubeClient, settings: Settings,
                 lease_client: KubeClient | None = None) -> None:
        self._api_client = api_client
        self._settings = settings
        self._writer = StatusWriter(api_client)
        self.watcher = ClusterWatcher(api_client, settings, ours=self._ours)
        self._actuator = Actuator(api_client)
        self._versions = HeldVersions()  # the members' versions across our own writes
        # The Leases get connections of their own: a burst of pool writes (a lead taken over
        # a thousand pools writes each status, stamps each member) must never make a renew
        # wait for a connection past its deadline.
        self._lease_client = lease_client or KubeClient(api_client.credentials,
                                                        api_client.request_timeout)
        self.replicas = Replicas(self._lease_client, settings, self.watcher.relist,
                                 on_lead=lambda key, leading: self._fences.lead_changed(
                                     key, leading))
        turns = WriteTurns()  # the lead's status writes and fences, statuses first
        self._fences = TakeoverFences(self._actuator, self.watcher, self._versions,
                                      self.replicas.identity, turns)
        self._publisher = StatusPublisher(
            self._writer, self.watcher, may_write=self.replicas.leads,
            reread=lambda key: self.watcher.reread(POOLS, key.namespace, key.name),
            spec_invalid=self._spec_invalid,
            backoff_initial=settings.api_retry_initial, backoff_max=settings.api_retry_max,
            turns=turns)
        self._events = EventRecorder(api_client, uids=self.watcher.pool_uid)
        self._session: aiohttp.ClientSession | None = None
        self._event_tasks: set[asyncio.Task[None]] = set()
        # the pools as last reported, for the (optional) route check
        self._route_check: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    @classmethod
    async def create(cls, settings: Settings) -> KubePlatform:
        """Build the API client from settings and the platform around it."""
        return cls(await make_api_client(settings), settings)

    @property
    def synced(self) -> asyncio.Event:
        """Set once the first list of every kind in every namespace, and of the Leases, is in."""
        return self._synced

    @property
    def elects(self) -> bool:
        """Own and auto mode elect a leader per pool; in llmkube mode LLMKube actuates."""
        return self._settings.actuation != "llmkube"

    async def run(self, listener: PoolListener) -> None:
        """Join the replicas, then watch the cluster forever, reporting to ``listener``."""
        await self.replicas.start()  # before any pool state is read (docs/design/replicas.md)
        if self._settings.route_check_interval > 0:
            checker = RouteChecker(self._api_client, self._settings, self._events,
                                   self.watcher.pools)
            self._route_check = asyncio.get_running_loop().create_task(checker.run())
        async with asyncio.TaskGroup() as group:
            group.create_task(self.replicas.run())
            group.create_task(self.watcher.run(self.replicas.attach(listener)))
            await self.watcher.synced.wait()
            await self.replicas.listed.wait()
            self._synced.set()

    async def leave(self) -> None:
        """SIGTERM: hand every pool's leadership to another replica now."""
        await self.replicas.leave()

    async def stop(self, clean: bool = True) -> None:
        """Finish pending events, drop pending status writes and close connections; the
        membership Lease is deleted only when ``clean`` (no stream was cut)."""
        if self._route_check is not None:
            self._route_check.cancel()
        if self._event_tasks:
            await asyncio.wait(self._event_tasks, timeout=2.0)
        await self._publisher.close()
        self._fences.close()
        await self.replicas.stop(clean)
        if self._session is not None:
            await self._session.close()
        if self._lease_client is not self._api_client:
            await self._lease_client.close()
        await self._api_client.close()

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Set a member's replicas (one attempt; the runtime retries); only the pool's leader
        may: a deposed one finds out here, on its own clock, before it writes, and a write
        it sent before that lands only if the member is still as it saw it (fencing.py)."""
        if not self.replicas.leads(key):
            raise NotLeader(f"this replica does not lead pool {key}")
        await self._fences.ready(key)  # this lead's stamps first: older writes now fail
        if not self.replicas.leads(key):
            raise NotLeader(f"this replica no longer leads pool {key}")
        where = (key.namespace, member)
        _, cached = self.watcher.member_replicas(key, member)
        # No version known: the cache has never seen the member; the API answers 404 then.
        version = self._versions.precondition(where, cached)
        try:
            answered = await self._actuator.scale(key.namespace, member, replicas, version)
        except ApiError as exc:
            if exc.status == 409:
                # The member changed since we looked: read it again, so the policy decides on
                # the fresh observation and the scaler's next try (if the policy still wants
                # it) carries the fresh version; never the same write again.
                self._versions.forget(where)
                with contextlib.suppress(*TRANSPORT_ERRORS, ApiError):
                    await self.watcher.reread(SERVICES, key.namespace, member)
            if 400 <= exc.status < 500:
                raise ScaleRefused(exc.status, exc.reason) from exc
            raise
        self._versions.wrote(where, version, answered)

    async def trigger(self, key: PoolKey, member: str) -> None:
        """llmkube mode: replicas 0 -> 1, guarded by the resourceVersion the watch last saw."""
        replicas, version = self.watcher.member_replicas(key, member)
        if replicas >= 1:
            return  # someone (another replica, LLMKube) already asked for it
        await self._actuator.trigger(key.namespace, member, version)

    async def probe_idle(self, key: PoolKey, member: str) -> bool | None:
        """Ask the member's runtime whether it is idle (None: cannot tell, or no probe)."""
        probe = self.watcher.idle_probe(key, member)
        if probe is None:
            # Fail closed: a runtime we cannot ask is not known to be idle.
            log.warning("no idle probe for member", namespace=key.namespace, pool=key.name,
                        member=member)
            return None
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = self._settings.idle_probe_url.format(member=member, namespace=key.namespace,
                                                   pool=key.name)
        return await run_probe(self._session, probe, url, self._settings.idle_probe_timeout)

    async def carry_slots(self, key: PoolKey, member: str, step: str) -> CarryResult:
        """Save or restore ``member``'s llama.cpp slots, at the idle probe's ``/slots`` URL."""
        model = self.watcher.carried_model(key, member)
        if not model:
            return CarryResult(False, "the member does not carry its prompt cache")
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = self._settings.idle_probe_url.format(member=member, namespace=key.namespace,
                                                   pool=key.name)
        return await carry(self._session, url, step,
                           lambda slot: slot_file(key.namespace, member, model, slot))

    def publish(self, view: PoolView) -> None:
        """Queue the pool's status for writing (latest view wins)."""
        self._publisher.submit(view)

    def announce(self, key: PoolKey, target: str) -> None:
        """Have the pool's leader Lease announce ``target`` (a no-op unless we lead it)."""
        self.replicas.announce(key, target)

    def load_changed(self, urgent: bool) -> None:
        """Write the membership Lease soon (``urgent``: a swap waits for it)."""
        self.replicas.load_changed(urgent)

    def _ours(self, key: PoolKey, status: dict) -> bool:
        # A status change is someone else's only if we lead the pool (a peer's writes while
        # it led are not a fight) and it is not one of our own recent writes.
        return not self.replicas.judges(key) or self._writer.matches(key, status)

    def notify(self, key: PoolKey, notice: Notice) -> None:
        """Record an Event on the pool in the background."""
        self._record(key, notice.kind, notice.message, is_warning(notice))

    def _spec_invalid(self, key: PoolKey, message: str) -> None:
        """Our status write turned SpecValid False: a Warning Event says why, once."""
        taken = any(spec.key == key and spec.unrouted for spec in self.watcher.pools())
        self._record(key, "ModelNameTaken" if taken else "InvalidSpec", message, True)

    def _record(self, key: PoolKey, reason: str, message: str, warning: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._events.record(
            key, reason, message, warning=warning))
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)
