"""Assembles the running service: gRPC server, health, metrics endpoint, pools source.

Start-up order matters: the gRPC health service says NOT_SERVING until the pools source has
delivered its first full picture, so Envoy's health checks (and Kubernetes probes) only send
traffic once every pool and member is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import time
from dataclasses import asdict
from typing import Any

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import metrics
from .logs import get_logger
from .platform.contract import Platform
from .platform.static import StaticPlatform, load_endpoints, load_specs
from .protocol.service import SERVICE, ExtProcService
from .runtime.hub import Hub
from .settings import Settings
from .transport import seam as transport

log = get_logger(__name__)
#: The version of the /pools documents: fields are only ever added under it.
QUEUE_API = "modelpool-extproc/v1"

# The gRPC receive limit must exceed Envoy's buffer limit (32 MiB in the shipped configs):
# a body between our own limit and Envoy's must reach us so we answer 413; a message over
# the gRPC limit breaks the stream instead, and Envoy fails open to a 503.
_GRPC_MESSAGE_FLOOR = 64 * 1024 * 1024
_GRPC_MESSAGE_SLACK = 1024 * 1024


class Service:
    """The whole process: start(), wait for a signal, stop() gracefully."""

    def __init__(self, settings: Settings, platform: Platform | None = None) -> None:
        self.settings = settings
        # Built from settings (static file or Kubernetes) unless given.
        self.platform = platform
        self.hub: Hub | None = None
        self._grpc: transport.GrpcServer | None = None
        self._health_grpc: grpc.aio.Server | None = None
        self._extproc: ExtProcService | None = None
        self._health = health_aio.HealthServicer()
        self._http: web.AppRunner | None = None
        self._background: list[asyncio.Task[Any]] = []
        self.grpc_port = 0
        self.health_port = 0
        self.metrics_port = 0
        self._stopping = False

    async def start(self) -> None:
        """Bind the listeners and start serving."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        # the protocol's "liveness": the process answers gRPC, whatever it serves yet
        await self._health.set("liveness", health_pb2.HealthCheckResponse.SERVING)
        metrics.configure(self.settings.router_name)
        loop = asyncio.get_running_loop()
        metrics.EVENT_LOOP_TASKS.set_function(lambda: len(asyncio.all_tasks(loop)))
        if self.platform is None:
            self.platform = await build_platform(self.settings)
        platform = self.platform
        self.hub = Hub(self.settings, platform)
        self._background.append(asyncio.create_task(platform.run(self.hub)))
        max_message = max(_GRPC_MESSAGE_FLOOR, self.settings.max_body_bytes + _GRPC_MESSAGE_SLACK)
        service = self._extproc = ExtProcService(self.hub, self.settings)

        def register(server: Any) -> None:
            server.add_generic_rpc_handlers((service.handler(),))
            health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self._grpc, self.grpc_port = await transport.start(self.settings, register, max_message)
        if self.settings.health_listen:
            await self._start_health_listener()
        if self.settings.metrics_listen:
            await self._start_http()
        listen = self.settings.listen
        # a Unix socket (unix:PATH, which grpc accepts as it is) has no port to show
        log.info("serving", grpc=listen if listen.startswith("unix:")
                 else f"{self._host(listen)}:{self.grpc_port}",
                 metrics=self.settings.metrics_listen and
                 f"{self._host(self.settings.metrics_listen)}:{self.metrics_port}",
                 pools_source=self.settings.pools_file or "kubernetes")
        self._background.append(asyncio.create_task(self._serve_when(platform.synced)))

    async def stop(self) -> None:
        """Stop accepting, let in-flight streams finish up to the grace period, then exit.

        Several replicas (docs/design/replicas.md, "Leaving"): NOT_SERVING first, leadership
        handed over at once, the membership Lease kept (with our in-flight counts) until the
        streams have ended, then deleted (``platform.stop``) so the others stop waiting for it.
        Streams still open when the grace runs out are cut while Envoy may still relay their
        responses: the Lease is then left to lapse, so the others count this replica's
        in-flight requests as unknown, not as none.
        """
        self._stopping = True
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.hub is not None:
            # Held requests would be cut when the grace period ends and reach the client as
            # Envoy's generic fail-open 503; answer them now with our own 503 + Retry-After.
            self.hub.reject_held("shutting_down", "the model router is restarting; retry")
            self.hub.stop_admitting()  # and admit nothing more: the open streams drain
        if self.platform is not None:
            await self.platform.leave()
        if self._health_grpc is not None:
            await self._health_grpc.stop(0)
        cut = 0
        if self._grpc is not None:
            log.info("draining", grace_s=self.settings.shutdown_grace,
                     streams=metrics.STREAMS_IN_FLIGHT._value.get())
            cut = await self._drain(self._grpc, self.settings.shutdown_grace)
        if self.hub is not None:
            self.hub.close()
        for task in self._background:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._background, return_exceptions=True)
        if self.platform is not None:
            await self.platform.stop(clean=not cut)
        if self._http is not None:
            await self._http.cleanup()
        log.info("stopped")

    async def run_until_signalled(self) -> None:
        """start(), then stop() on SIGTERM or SIGINT."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        # What start-up made (modules, settings, the pools' state) lives as long as the process:
        # out of the cyclic collector's sight, a full collection does not walk it again and
        # again while thousands of streams come and go (a 20,000-stream burst held the loop
        # ~200 ms in collections otherwise). Young collections stay as they are.
        gc.freeze()
        await stop.wait()
        await self.stop()

    # ---- pieces ------------------------------------------------------------------------------

    async def _drain(self, server: transport.GrpcServer, grace: float) -> int:
        """Stop ``server`` with ``grace``; the streams still open when the grace ran out
        (the server cuts them)."""
        stopping = asyncio.ensure_future(server.stop(grace))
        await asyncio.wait({stopping}, timeout=grace)
        cut = self._extproc.open_streams if self._extproc is not None else 0
        if cut:
            log.warning("shutdown grace ran out: cutting streams", streams=cut)
        await stopping
        return cut

    async def _serve_when(self, synced: asyncio.Event) -> None:
        await synced.wait()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("pools synced; serving traffic",
                 pools=[str(d.key) for d in self.hub.drivers()] if self.hub else [])
        await self._follow_admission()

    async def _follow_admission(self) -> None:
        """NOT_SERVING while this replica's membership Lease has lapsed (it admits nothing
        then), so Envoy's health checks send its new streams to the other replicas."""
        assert self.hub is not None
        serving = True
        while not self._stopping:
            left = self.hub.admit_until - time.monotonic()  # the membership's clock
            if (left > 0) != serving:
                serving = left > 0
                if serving:
                    log.info("membership lease renewed: serving again")
                else:
                    log.warning("membership lease lapsed: not serving")
                await self._set_health(health_pb2.HealthCheckResponse.SERVING if serving
                                       else health_pb2.HealthCheckResponse.NOT_SERVING)
            await asyncio.sleep(min(0.25, left) if left > 0 else 0.25)

    async def _set_health(self, status: int) -> None:
        # "readiness" too: the name the Endpoint Picker Protocol gives this same answer
        for name in ("", SERVICE, "readiness"):
            await self._health.set(name, status)
        metrics.set_serving(status == health_pb2.HealthCheckResponse.SERVING)

    async def _start_health_listener(self) -> None:
        # The kubelet's gRPC probe speaks plaintext only: with (m)TLS on the ext_proc port it
        # could not probe it, so the same health servicer is also served here, in the clear.
        self._health_grpc = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._health_grpc)
        self.health_port = self._health_grpc.add_insecure_port(self.settings.health_listen)
        await self._health_grpc.start()

    async def _start_http(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        if self.settings.debug_endpoints:
            app.router.add_get("/debug/pools", self._pools)
        app.router.add_get("/pools", self._queues)
        app.router.add_get("/pools/{namespace}/{name}", self._queues)
        # keepalive_timeout also bounds a connection that never completes a request (aiohttp
        # arms it on connect): its default of an hour would let silent sockets pile up.
        self._http = web.AppRunner(app, access_log=None,
                                   keepalive_timeout=self.settings.metrics_idle_timeout)
        await self._http.setup()
        host, _, port = self.settings.metrics_listen.rpartition(":")
        site = web.TCPSite(self._http, host or "127.0.0.1", int(port))
        await site.start()
        self.metrics_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.REGISTRY),
                            headers={"content-type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _pools(self, _request: web.Request) -> web.Response:
        views = [d.view() for d in self.hub.drivers()] if self.hub else []
        return web.Response(text=json.dumps([asdict(v) for v in views], default=str),
                            content_type="application/json")

    async def _queues(self, request: web.Request) -> web.Response:
        """The stable, read-only queue of every pool, or of one (docs/operations.md)."""
        wanted = (request.match_info.get("namespace"), request.match_info.get("name"))
        docs = [{"apiVersion": QUEUE_API, "namespace": d.key.namespace, "name": d.key.name,
                 **asdict(d.queue())} for d in (self.hub.drivers() if self.hub else [])
                if wanted[1] is None or (d.key.namespace, d.key.name) == wanted]
        if wanted[1] is None:
            return web.json_response({"apiVersion": QUEUE_API, "pools": docs})
        if not docs:
            return web.json_response({"error": {
                "message": f"no pool {wanted[0]}/{wanted[1]}", "type": "invalid_request_error",
                "param": None, "code": "pool_not_found"}}, status=404)
        return web.json_response(docs[0])

    @staticmethod
    def _host(address: str) -> str:
        return address.rpartition(":")[0]


async def build_platform(settings: Settings) -> Platform:
    """The static platform for a pools file, else the Kubernetes one (raises ConfigError)."""
    if settings.pools_file:
        specs = load_specs(settings.pools_file, settings)
        return StaticPlatform(specs, load_endpoints(settings.pools_file, specs, settings))
    from .platform.kube.platform import KubePlatform  # only needed in cluster mode

    return await KubePlatform.create(settings)


async def serve(settings: Settings) -> None:
    """Run the service until SIGTERM/SIGINT."""
    await Service(settings).run_until_signalled()
