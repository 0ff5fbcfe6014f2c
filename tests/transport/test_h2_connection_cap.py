"""Who gets in at the connection cap (extproc/transport/connection_cap.py, server.py): connections
without a preface, then idle ones, oldest first, make room (with a GOAWAY) for a new one; a
peer address holds only its share. On loopback, each peer its own 127.0.0.x address; counts
and closed sockets are asserted, never times."""

from __future__ import annotations

import asyncio

from test_h2_connection import frames_of
from test_h2_server import WAIT, Factory, Frames, method, serve, settle

from extproc.transport import frames as f
from extproc.transport.connection_cap import ConnectionCap

__all__ = ["serve"]  # the fixture, shared with test_h2_server


class Member:
    """A connection as admission sees it: its peer, and whether it was evicted."""

    def __init__(self, peer: str = "a") -> None:
        self.peer = peer
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True


def test_waiting_then_idle_connections_make_room_oldest_first() -> None:
    admission = ConnectionCap(cap=4, per_peer=4)
    old, busy, idle, late = Member(), Member(), Member(), Member()
    for member in (old, busy, idle, late):
        assert admission.admit(member)
    admission.note(busy, ready=True, busy=True)
    admission.note(idle, ready=True, busy=False)
    first, second, third = Member(), Member(), Member()
    assert admission.admit(first) and old.evicted and not late.evicted  # oldest waiting
    assert admission.admit(second) and late.evicted and not idle.evicted
    admission.note(first, ready=True, busy=True)
    admission.note(second, ready=True, busy=True)
    assert admission.admit(third) and idle.evicted  # then the idle one
    admission.note(third, ready=True, busy=True)
    assert not admission.admit(Member()) and not busy.evicted  # all busy: refused
    assert len(admission) == 4


def test_a_connection_idle_again_goes_to_the_back() -> None:
    admission = ConnectionCap(cap=2, per_peer=2)
    probed, quiet = Member(), Member()
    for member in (probed, quiet):
        admission.admit(member)
    admission.note(probed, ready=True, busy=False)
    admission.note(quiet, ready=True, busy=False)
    admission.note(probed, ready=True, busy=True)  # a request came, and went
    admission.note(probed, ready=True, busy=False)
    assert admission.admit(Member()) and quiet.evicted and not probed.evicted


def test_a_peer_past_its_share_makes_room_among_its_own() -> None:
    admission = ConnectionCap(cap=10, per_peer=2)
    other = Member("b")
    admission.admit(other)
    mine = [Member("a"), Member("a")]
    for member in mine:
        admission.admit(member)
    assert admission.admit(Member("a")) and mine[0].evicted and not other.evicted
    for member in mine[1:]:
        admission.note(member, ready=True, busy=True)
    assert admission.admit(Member("a"))  # its newest (waiting) one makes room
    assert len(admission) == 3 and not other.evicted


def test_peers_of_a_unix_socket_share_only_the_cap() -> None:
    admission = ConnectionCap(cap=3, per_peer=1)
    local = [Member(""), Member(""), Member("")]
    assert all(admission.admit(member) for member in local)
    assert not any(member.evicted for member in local)


async def closed_with_goaway(reader: asyncio.StreamReader) -> bool:
    """Whether the server said GOAWAY and closed (what it sent read to the end)."""
    data = await asyncio.wait_for(reader.read(), WAIT)
    return reader.at_eof() and any(k == f.GOAWAY for k, *_ in frames_of(data))


def held(served: object, writer: asyncio.StreamWriter) -> bool:
    """Whether the server still holds the connection of ``writer``."""
    port = writer.get_extra_info("sockname")[1]
    return any(p.transport.get_extra_info("peername")[1] == port
               for p in served.server.connections)  # type: ignore[attr-defined]


async def test_a_new_client_gets_in_past_connections_without_a_preface(serve: Factory) -> None:
    served = await serve(max_connections=4, max_connections_per_peer=4)
    silent = [await asyncio.open_connection("127.0.0.1", served.port) for _ in range(4)]
    assert await settle(lambda: len(served.server.connections) == 4)
    async with served.channel() as channel:
        assert await method(channel, "Echo")(b"in", timeout=WAIT) == b"in"
    assert await closed_with_goaway(silent[0][0])  # the oldest made room
    assert all(held(served, writer) for _reader, writer in silent[1:])
    for _reader, writer in silent:
        writer.close()


async def test_a_new_client_gets_in_past_idle_connections(serve: Factory) -> None:
    served = await serve(max_connections=3, max_connections_per_peer=3)
    idle = [await Frames.open(served.port) for _ in range(3)]
    assert await settle(lambda: all(p.conn.preface_received
                                    for p in served.server.connections)
                        and len(served.server.connections) == 3)
    async with served.channel() as channel:
        assert await method(channel, "Echo")(b"in", timeout=WAIT) == b"in"
    frames = await idle[0].until(lambda fs: idle[0].eof)
    assert any(k == f.GOAWAY for k, *_ in frames)
    assert all(held(served, raw.writer) for raw in idle[1:])
    for raw in idle:
        raw.writer.close()


async def test_a_peer_past_its_share_closes_its_own_not_anothers(serve: Factory) -> None:
    served = await serve(max_connections=10, max_connections_per_peer=2)
    other = await asyncio.open_connection("127.0.0.1", served.port, local_addr=("127.0.0.3", 0))
    mine = [await asyncio.open_connection("127.0.0.1", served.port,
                                          local_addr=("127.0.0.2", 0)) for _ in range(3)]
    assert await closed_with_goaway(mine[0][0])
    assert await settle(lambda: len(served.server.connections) == 3)
    assert held(served, other[1]) and held(served, mine[1][1]) and held(served, mine[2][1])
    for _reader, writer in (other, *mine):
        writer.close()
