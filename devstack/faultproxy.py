"""`FaultProxy`: a loopback TCP proxy whose link a test can cut and restore.

The local stack puts one between each ext_proc replica and the API server (the replica's
kubeconfig names the proxy), so a test can cut one replica off the API while the others keep
theirs: the partition docs/design/replicas.md's "follower cut off from the API server" case needs.

- ``cut()`` resets every open connection (the replica's watches and keep-alive connections fail
  at once) and from then on black-holes new ones: accepted, never forwarded, never answered, so
  the replica's requests hang until its own timeouts fire, as across a partition.
  ``cut(refuse=True)`` resets new connections instead (an API server that is down).
- ``restore()`` resets the black-holed connections (their requests were never sent anywhere)
  and forwards new connections again.

The proxy runs its own asyncio loop in a daemon thread, so synchronous tests and async tests
(whose loop it must not share) call it alike. It listens on 127.0.0.1 only, forwards only to a
loopback address, and holds at most ``max_connections`` connections; beyond, new ones are reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import threading
from dataclasses import dataclass, field

from devstack.procs import LOCALHOST

MAX_CONNECTIONS = 64  # a replica opens a few (its watches, a keep-alive pool); 64 is generous
CHUNK = 64 * 1024  # read size; with drain() it bounds what one connection buffers
CONNECT_TIMEOUT = 2.0  # to the target, which is on loopback: either at once or never
CALL_TIMEOUT = 5.0  # a control call (start, cut, restore, stop) is a few loop turns


class ProxyError(RuntimeError):
    """The proxy could not start, or a control call did not complete in time."""


@dataclass
class ProxyStats:
    """What the proxy did so far: connections accepted, forwarded, black-holed, reset."""

    accepted: int = 0
    forwarded: int = 0  # connected through to the target
    black_holed: int = 0  # accepted while cut and held silent
    reset: int = 0  # closed with RST: at a cut, at a restore, refused, or over the bound
    bytes_up: int = 0  # client -> target
    bytes_down: int = 0  # target -> client


@dataclass(eq=False)  # identity: links live in a set
class _Link:
    """One client connection: its writer and, once forwarded, the target's and the pumps."""

    client: asyncio.StreamWriter
    target: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host``:``target_port`` until cut; see the module."""

    def __init__(self, target_host: str, target_port: int, *, port: int = 0,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        if not ipaddress.ip_address(socket.gethostbyname(target_host)).is_loopback:
            raise ValueError(f"the fault proxy forwards to loopback only, not {target_host}")
        self.target = (target_host, int(target_port))
        self.port = port  # the kernel's pick once started, when 0
        self.max_connections = max_connections
        self.stats = ProxyStats()
        self._cut = False
        self._refuse = False
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[None]] = set()  # one per accepted connection
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, what a client connects to."""
        return f"{LOCALHOST}:{self.port}"

    @property
    def running(self) -> bool:
        """True between start() and stop() (its thread is alive)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def is_cut(self) -> bool:
        """True between cut() and restore()."""
        return self._cut

    @property
    def open_connections(self) -> int:
        """Connections held now (forwarded and black-holed)."""
        return len(self._links)

    # ---- control (any thread but the proxy's own) -------------------------------------------

    def start(self) -> FaultProxy:
        """Listen and forward; returns once the port accepts connections."""
        if self._thread is not None:
            raise ProxyError("the fault proxy is already started")
        self._loop = asyncio.new_event_loop()
        listening = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(listening,),
                                        name=f"faultproxy-{self.target[1]}", daemon=True)
        self._thread.start()
        if not listening.wait(CALL_TIMEOUT) or self._server is None:
            self.stop()
            raise ProxyError(f"the fault proxy for {self.target} did not start listening")
        return self

    def cut(self, refuse: bool = False) -> None:
        """Reset every open connection; black-hole new ones (reset them with ``refuse``)."""
        self._call(self._do_cut(refuse))

    def restore(self) -> None:
        """Reset the black-holed connections and forward new ones again."""
        self._call(self._do_restore())

    def stop(self) -> None:
        """Close the listener and every connection, end the thread (idempotent)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            with contextlib.suppress(ProxyError, RuntimeError):  # loop already closing
                self._call(self._shutdown())
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CALL_TIMEOUT)
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: object) -> None:
        if self._loop is None:
            raise ProxyError("the fault proxy is not running")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            future.result(CALL_TIMEOUT)
        except TimeoutError:
            future.cancel()
            raise ProxyError("the fault proxy did not answer a control call in time") from None

    # ---- the proxy's loop -----------------------------------------------------------------

    def _run(self, listening: threading.Event) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, LOCALHOST, self.port))
            self.port = self._server.sockets[0].getsockname()[1]
            listening.set()
            self._loop.run_forever()
        finally:
            listening.set()  # start() must not wait out its timeout when binding failed
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        handler.add_done_callback(self._handlers.discard)
        if len(self._links) >= self.max_connections or (self._cut and self._refuse):
            self._reset(writer)
            return
        link = _Link(writer)
        self._links.add(link)
        try:
            if self._cut:
                self.stats.black_holed += 1
                await self._swallow(reader)
            else:
                await self._forward(link, reader)
        finally:
            self._links.discard(link)
            self._close(link)

    async def _forward(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the cancellation of a
            # proxy being stopped when it meets a connect that just succeeded
            async with asyncio.timeout(CONNECT_TIMEOUT):
                target_reader, link.target = await asyncio.open_connection(*self.target)
        except (OSError, TimeoutError):
            self._reset(link.client)  # the target is down: the client sees a reset, not a hang
            return
        if link not in self._links:  # cut while connecting: the client was reset already
            self._reset(link.target)
            return
        self.stats.forwarded += 1
        link.tasks = [asyncio.create_task(self._pump(reader, link.target, "bytes_up")),
                      asyncio.create_task(self._pump(target_reader, link.client, "bytes_down"))]
        # Both directions end at EOF (passed on as a half close) or at the first error, which
        # ends the other one too: a connection is never left half alive.
        done, pending = await asyncio.wait(link.tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:
            task.cancel()
        await asyncio.gather(*link.tasks, return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    counter: str) -> None:
        while True:  # ends at EOF, at an error, or when a cut cancels it
            data = await reader.read(CHUNK)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            setattr(self.stats, counter, getattr(self.stats, counter) + len(data))
            writer.write(data)
            await writer.drain()

    @staticmethod
    async def _swallow(reader: asyncio.StreamReader) -> None:
        # A black hole reads and drops what the client sends, so the client's writes never
        # block on a full window; it ends when the client gives up or a restore resets it.
        while await reader.read(CHUNK):
            pass

    async def _do_cut(self, refuse: bool) -> None:
        self._cut, self._refuse = True, refuse
        self._drop_all()

    async def _do_restore(self) -> None:
        self._cut = self._refuse = False
        self._drop_all()  # what is left is black-holed: those requests never reached the target

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._drop_all()
        # The dropped connections' handlers end in a loop turn or two; let them, so the loop
        # closes with no task pending.
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=CALL_TIMEOUT / 2)

    def _drop_all(self) -> None:
        for link in list(self._links):
            for task in link.tasks:
                task.cancel()
            self._reset(link.client)
            if link.target is not None:
                self._reset(link.target)
        self._links.clear()

    def _reset(self, writer: asyncio.StreamWriter) -> None:
        """Close with RST (SO_LINGER 0), so the peer's next read fails at once."""
        sock = writer.get_extra_info("socket")
        if sock is not None and not writer.is_closing():
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.stats.reset += 1
        writer.transport.abort()

    @staticmethod
    def _close(link: _Link) -> None:
        for writer in (link.client, link.target):
            if writer is not None and not writer.is_closing():
                writer.close()
