"""devstack.faultproxy: forwarding, cut (reset, black hole, refuse), restore, the bound, stop,
with real sockets on loopback and a threaded echo server as the target."""

from __future__ import annotations

import socket
import socketserver
import threading
from typing import Iterator

import pytest

from devstack.faultproxy import FaultProxy
from devstack.testkit import wait_until

QUIET = 0.3  # how long a black-holed connection must stay silent to count as silent


class Echo(socketserver.BaseRequestHandler):
    """Sends back whatever it receives, until the client closes."""

    def handle(self) -> None:
        """Echo one connection."""
        self.server.connections += 1  # type: ignore[attr-defined]
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[socketserver.ThreadingTCPServer]:
    """An echo server on a free loopback port, counting its connections."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    server.connections = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(echo: socketserver.ThreadingTCPServer) -> Iterator[FaultProxy]:
    """A started FaultProxy in front of the echo server."""
    with FaultProxy("127.0.0.1", echo.server_address[1]) as started:
        yield started


def connect(proxy: FaultProxy) -> socket.socket:
    """A client connection to the proxy, with a short timeout on every call."""
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=2)


def round_trip(sock: socket.socket, data: bytes = b"ping") -> bytes:
    """Send ``data`` and read as many bytes back."""
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def is_reset(sock: socket.socket) -> bool:
    """True when the connection was reset (or closed) by the other end."""
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def new_connection_is_reset(proxy: FaultProxy) -> bool:
    """True when a new connection is reset (on loopback the reset can beat connect's return)."""
    try:
        sock = connect(proxy)
    except ConnectionResetError:
        return True
    with sock:
        return is_reset(sock)


def is_silent(sock: socket.socket) -> bool:
    """True when a request gets no answer and no close for QUIET seconds."""
    sock.settimeout(QUIET)
    sock.sendall(b"anyone?")
    try:
        return sock.recv(1) == b"x"  # never: either data or a close is a reply
    except socket.timeout:
        return True
    except ConnectionResetError:
        return False


def test_forwards_both_ways_and_counts(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert round_trip(sock, b"a" * 200_000) == b"a" * 200_000
        assert proxy.open_connections == 1
    wait_until(lambda: proxy.open_connections == 0, 2, "the closed connection to be let go")
    assert proxy.stats.forwarded == 1
    assert proxy.stats.bytes_up == proxy.stats.bytes_down == 200_000


def test_cut_resets_open_connections_and_black_holes_new_ones(
        proxy: FaultProxy, echo: socketserver.ThreadingTCPServer) -> None:
    with connect(proxy) as before:
        assert round_trip(before) == b"ping"
        proxy.cut()
        assert proxy.is_cut
        assert is_reset(before)
    with connect(proxy) as during:  # accepted ...
        assert is_silent(during)  # ... and never answered
    assert echo.connections == 1  # the black-holed one never reached the target
    assert proxy.stats.black_holed == 1


def test_cut_with_refuse_resets_new_connections(proxy: FaultProxy) -> None:
    proxy.cut(refuse=True)
    assert new_connection_is_reset(proxy)
    assert proxy.stats.black_holed == 0


def test_restore_resets_the_black_holed_and_forwards_again(proxy: FaultProxy) -> None:
    proxy.cut()
    with connect(proxy) as held:
        assert is_silent(held)
        proxy.restore()
        assert not proxy.is_cut
        held.settimeout(2)
        assert is_reset(held)  # its request went nowhere: the client must retry it
    with connect(proxy) as after:
        assert round_trip(after) == b"ping"


def test_connections_beyond_the_bound_are_reset(echo: socketserver.ThreadingTCPServer) -> None:
    with FaultProxy("127.0.0.1", echo.server_address[1], max_connections=2) as proxy:
        first, second = connect(proxy), connect(proxy)
        try:
            assert round_trip(first) == round_trip(second) == b"ping"
            assert new_connection_is_reset(proxy)  # the third
        finally:
            first.close()
            second.close()


def test_a_target_that_is_down_is_a_reset_not_a_hang() -> None:
    with socket.socket() as spare:  # a port nothing listens on
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    with FaultProxy("127.0.0.1", port) as proxy:
        assert new_connection_is_reset(proxy)


def test_stop_closes_everything_and_ends_the_thread(echo: socketserver.ThreadingTCPServer) -> None:
    proxy = FaultProxy("127.0.0.1", echo.server_address[1]).start()
    sock = connect(proxy)
    assert round_trip(sock) == b"ping"
    assert proxy.running
    proxy.stop()
    proxy.stop()  # idempotent
    assert not proxy.running
    assert is_reset(sock)
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2)


def test_only_loopback_targets() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("192.0.2.1", 443)
