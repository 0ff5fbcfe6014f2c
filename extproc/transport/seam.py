"""The one seam between the ext_proc protocol and the gRPC server under it.

Two servers can carry the service's gRPC (``--grpc-server``): ``native``, this package's own
HTTP/2 server on the event loop, and ``grpcio``, grpc.aio on gRPC core. Both take generic
handlers the same way; ``start`` builds the chosen one, lets the caller register its handlers,
binds ``--listen`` (with TLS when configured) and starts it.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import grpc

from ..settings import Settings
from . import listener as native


class GrpcServer(Protocol):
    """What the service needs of a started gRPC server."""

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; cut what is still open after ``grace`` seconds."""


async def start(settings: Settings, register: Callable[[Any], None],
                max_message: int) -> tuple[GrpcServer, int]:
    """The chosen server with ``register``'s handlers, serving on ``--listen``: (it, its port)."""
    if settings.grpc_server == "native":
        server = native.Server(max_message=max_message,
                               max_concurrent_streams=settings.max_streams_per_connection,
                               max_connections=settings.max_connections,
                               idle_timeout=settings.connection_idle_timeout)
        register(server)
        return server, await server.start(settings.listen, tls_context(settings))
    aio = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", max_message),
        ("grpc.max_concurrent_streams", settings.max_streams_per_connection),
        # Each parked request is an open call. By default gRPC core cancels calls the
        # application has not picked up once 1,000 are pending, which under a burst turns
        # held requests into Envoy's fail-open 503 (measured in the benchmark).
        ("grpc.server.max_pending_requests", 100_000),
        ("grpc.server.max_pending_requests_hard_limit", 100_000),
        ("grpc.so_reuseport", 0),
        *([("grpc.max_connection_idle_ms", int(settings.connection_idle_timeout * 1000))]
          if settings.connection_idle_timeout else []),
    ])
    register(aio)
    port = _bind(aio, settings)
    await aio.start()
    return aio, port


def tls_context(s: Settings) -> ssl.SSLContext | None:
    """The native server's TLS context (None without --tls-cert)."""
    return native.tls_context(s.tls_cert, s.tls_key, s.tls_client_ca) if s.tls_cert else None


def _bind(server: grpc.aio.Server, s: Settings) -> int:
    if not s.tls_cert:
        return int(server.add_insecure_port(s.listen))
    key, cert = Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes()
    ca = Path(s.tls_client_ca).read_bytes() if s.tls_client_ca else None
    credentials = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                              require_client_auth=ca is not None)
    return int(server.add_secure_port(s.listen, credentials))
