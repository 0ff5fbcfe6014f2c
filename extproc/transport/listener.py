"""The native gRPC server's listener: the handlers it serves (registered as grpc.aio takes
them: ``add_generic_rpc_handlers``, ``add_registered_method_handlers``), the sockets it
listens on (TCP or a Unix socket, TLS with ALPN ``h2``), and its graceful stop. Each accepted
connection is a ``server._Protocol``. Every few seconds it looks at the calls running, to give
memory back once a crowd of them has gone (``trim.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import grpc

from .connection_cap import ConnectionCap
from .server import _Protocol
from .trim import LOOK_EVERY, Trimmer, give_back, libc_trim

# The listening socket's backlog, which is also how many connections the loop accepts in one
# turn (asyncio's accept loop, and libuv's under uvloop, take what is queued): each costs its
# connection_made and maybe an eviction, so a burst of 4,096 reconnecting attackers held the
# loop 250-550 ms. 256 bounds a turn to a few milliseconds; past it the kernel drops SYNs and
# a client's retransmission brings it in a moment later.
ACCEPT_BACKLOG = 256


class _Details(NamedTuple):
    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


class Server:
    """A gRPC server on the event loop, with grpc.aio.Server's registration and stop()."""

    def __init__(self, *, max_message: int, max_concurrent_streams: int = 1 << 20,
                 max_connections: int = 1000, max_connections_per_peer: int = 1000,
                 idle_timeout: float = 0.0) -> None:
        self.loop = asyncio.get_running_loop()
        self.max_message = max_message
        self.max_concurrent_streams = max_concurrent_streams
        self.admission = ConnectionCap(max_connections, max_connections_per_peer)
        self.idle_timeout = idle_timeout  # seconds without a stream before a drain (0: never)
        self.connections: set[_Protocol] = set()
        self.stopping = False  # stop() has begun: a connection made now is closed at once
        self._generic: list[grpc.GenericRpcHandler] = []
        self._registered: dict[str, Any] = {}
        self._methods: dict[str, Any] = {}
        self._listeners: list[asyncio.AbstractServer] = []
        self._socket_path: Path | None = None
        self.live_calls = 0  # handlers running (``server._Protocol`` counts them)
        self._trimmer = Trimmer()
        self._trim = libc_trim()
        self._look_timer: asyncio.TimerHandle | None = None

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        """Serve these handlers (as grpc.aio.Server does)."""
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        """Serve these methods of ``service`` (as grpc.aio.Server does)."""
        for name, handler in handlers.items():
            self._registered[f"/{service}/{name}"] = handler

    def method(self, path: str) -> Any:
        """The handler of ``path`` (``/package.Service/Method``), or None."""
        if path in self._methods:
            return self._methods[path]
        found = self._registered.get(path)
        for generic in self._generic:
            if found is not None:
                break
            found = generic.service(_Details(path, ()))
        if len(self._methods) < 64:  # bounded: a peer could name endless methods
            self._methods[path] = found
        return found

    def _look(self) -> None:
        """Give memory back when the calls running have fallen far from their peak."""
        if self._trimmer.look(self.live_calls):
            give_back(lambda trim: self.loop.run_in_executor(None, trim), self._trim)
        self._look_timer = self.loop.call_later(LOOK_EVERY, self._look)

    async def start(self, listen: str, tls: ssl.SSLContext | None = None) -> int:
        """Listen on ``host:port`` or ``unix:PATH``; the bound TCP port (0 for a socket)."""
        if self._look_timer is None:
            self._look_timer = self.loop.call_later(LOOK_EVERY, self._look)
        if listen.startswith("unix:"):
            path = listen[len("unix:"):].removeprefix("//")
            with contextlib.suppress(FileNotFoundError):
                Path(path).unlink()  # a socket left by an earlier process
            listener = await self.loop.create_unix_server(lambda: _Protocol(self), path,
                                                          ssl=tls, backlog=ACCEPT_BACKLOG)
            self._listeners.append(listener)
            self._socket_path = Path(path)
            return 0
        host, _, port = listen.rpartition(":")
        listener = await self.loop.create_server(lambda: _Protocol(self), host.strip("[]"),
                                                 int(port), ssl=tls, backlog=ACCEPT_BACKLOG,
                                                 reuse_address=True)
        self._listeners.append(listener)
        return int(listener.sockets[0].getsockname()[1])

    async def stop(self, grace: float | None) -> None:
        """Take no new calls; give open ones ``grace`` seconds, then cut them."""
        self.stopping = True
        if self._look_timer is not None:
            self._look_timer.cancel()
        for listener in self._listeners:
            listener.close()
        for protocol in list(self.connections):
            protocol.goaway()
        if grace:
            deadline = self.loop.time() + grace
            while any(p.calls for p in self.connections) and self.loop.time() < deadline:
                await asyncio.sleep(0.05)
        tasks = [c.task for p in self.connections for c in p.calls.values() if c.task]
        for protocol in list(self.connections):
            protocol.close()
        for listener in self._listeners:
            await listener.wait_closed()
        if tasks:  # the cut calls' handlers unwind (their accounting runs) before we return
            await asyncio.wait(tasks, timeout=5)
        for _ in range(20):  # closed transports flush first; give a peer a second to read
            if not self.connections:
                break
            await asyncio.sleep(0.05)
        for protocol in list(self.connections):
            protocol.abort()  # a peer not reading keeps no socket of ours after stop()
        if self._socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._socket_path.unlink()


def tls_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """A server TLS context offering h2 (ALPN); clients must present a certificate signed by
    ``client_ca`` when it is given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
