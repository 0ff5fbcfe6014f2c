"""The runtime's Platform in cluster mode: one object that owns the watcher, actuator, status
publisher, event recorder and idle-probe session, built from Settings."""

from __future__ import annotations

import asyncio
from typing import Protocol

import aiohttp
from kubernetes.aio.client import ApiClient

from extproc.platform.kube.actuator import Actuator
from extproc.platform.kube.cache import ClusterWatcher
from extproc.platform.kube.client import make_api_client
from extproc.platform.kube.events import EventRecorder
from extproc.platform.kube.idle import probe_idle
from extproc.platform.kube.routecheck import RouteChecker
from extproc.platform.kube.status import StatusPublisher, StatusWriter
from extproc.platform.listener import PoolListener
from extproc.policy.model import MemberObservation, PoolKey, PoolSpec, PoolView
from extproc.settings import Settings

# Notices that mean something went wrong for users of the pool: shown as Warning events.
_WARNINGS = ("SwapFailed", "MemberLost")


class NoticeLike(Protocol):
    """What ``notify`` reads from the policy's Notice (kept structural: no policy import)."""

    kind: str
    message: str


class KubePlatform:
    """Watches the cluster for the runtime and carries out its scale, status and event calls."""

    def __init__(self, api_client: ApiClient, settings: Settings, *,
                 idle_timeout: float = 2.0) -> None:
        self._api_client = api_client
        self._settings = settings
        self._idle_timeout = idle_timeout
        self._listener: PoolListener | None = None
        self.watcher = ClusterWatcher(api_client, settings.namespaces, self, settings=settings)
        self.synced = self.watcher.synced
        self._actuator = Actuator(api_client)
        self._writer = StatusWriter(api_client)
        self._publisher = StatusPublisher(self._writer, self.watcher)
        self._events = EventRecorder(api_client, uids=self.watcher.pool_uid)
        self._session: aiohttp.ClientSession | None = None
        self._event_tasks: set[asyncio.Task[None]] = set()
        # the pools as last reported, for the (optional) route check
        self._specs: dict[PoolKey, PoolSpec] = {}
        self._route_check: asyncio.Task[None] | None = None

    @classmethod
    async def create(cls, settings: Settings) -> KubePlatform:
        """Build the API client from settings and the platform around it."""
        return cls(await make_api_client(settings), settings)

    async def run(self, listener: PoolListener) -> None:
        """Watch the cluster forever, reporting to ``listener`` (the runtime's hub)."""
        self._listener = listener
        if self._settings.route_check_interval > 0:
            checker = RouteChecker(self._api_client, self._settings, self._events,
                                   lambda: self._specs.values())
            self._route_check = asyncio.get_running_loop().create_task(checker.run())
        await self.watcher.run()

    async def stop(self) -> None:
        """Finish pending events, drop pending status writes and close connections."""
        if self._route_check is not None:
            self._route_check.cancel()
        if self._event_tasks:
            await asyncio.wait(self._event_tasks, timeout=2.0)
        await self._publisher.close()
        if self._session is not None:
            await self._session.close()
        await self._api_client.close()

    # --- PoolListener: the watcher reports here, this forwards to the runtime --------------

    def pool_changed(self, spec: PoolSpec, status: dict) -> None:
        """Forward to the runtime."""
        self._specs[spec.key] = spec
        if self._listener is not None:
            self._listener.pool_changed(spec, status)

    def pool_removed(self, key: PoolKey) -> None:
        """Forward to the runtime."""
        self._specs.pop(key, None)
        if self._listener is not None:
            self._listener.pool_removed(key)

    def member_changed(self, key: PoolKey, obs: MemberObservation) -> None:
        """Forward to the runtime."""
        if self._listener is not None:
            self._listener.member_changed(key, obs)

    # --- the runtime's Platform protocol -----------------------------------------------------

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Set a member's replicas, retrying until done or cancelled."""
        await self._actuator.scale(key.namespace, member, replicas)

    async def probe_idle(self, key: PoolKey, member: str) -> bool | None:
        """Ask the member's llama.cpp /slots whether it is idle (None: cannot tell)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = self._settings.idle_probe_url.format(member=member, namespace=key.namespace,
                                                   pool=key.name)
        return await probe_idle(self._session, url, self._idle_timeout)

    def publish(self, view: PoolView) -> None:
        """Queue the pool's status for writing (latest view wins)."""
        self._publisher.submit(view)

    def notify(self, key: PoolKey, notice: NoticeLike) -> None:
        """Record an Event on the pool in the background."""
        task = asyncio.get_running_loop().create_task(self._events.record(
            key, notice.kind, notice.message, warning=notice.kind in _WARNINGS))
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)
