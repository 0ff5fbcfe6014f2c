"""Which connections the native gRPC server keeps once ``--max-connections`` is reached.

A connection that has not sent its preface, or has no stream open, serves nobody now; one
with streams open is a client's requests. So when the cap is reached a new connection is not
turned away while idle ones are held: the one that has waited longest for its preface is
closed, or else the one idle the longest (with a GOAWAY, which tells a client that nothing it
sent was lost), and the new one takes its place. A peer that opens idle connections by the
thousand thus closes its own oldest ones, and a client that sends its preface and requests
always gets in. Each peer address may also hold only a share of the cap
(``--max-connections-per-peer``): past it, a new connection from that address makes room
among that address's own idle connections, never another's (on a Unix socket, with no
address, only the cap counts).
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol


class Member(Protocol):
    """What admission needs of a connection (``server._Protocol``)."""

    peer: str

    def evict(self) -> None:
        """Close the connection now: GOAWAY, then the socket."""


class ConnectionCap:
    """The connections held, by peer, and which of them are idle, oldest first."""

    def __init__(self, cap: int, per_peer: int) -> None:
        self.cap, self.per_peer = cap, min(per_peer, cap)
        self._peers: Counter[str] = Counter()
        self._members: set[Member] = set()
        # Insertion-ordered: the first is the one that has waited (or idled) the longest
        self._waiting: dict[Member, None] = {}  # no preface yet
        self._idle: dict[Member, None] = {}  # preface received, no stream open

    def __len__(self) -> int:
        return len(self._members)

    def admit(self, member: Member) -> bool:
        """Make room for a new connection (closing idle ones) and count it; False when every
        connection it could replace is busy."""
        # (a Unix socket's peers have no address to share by: only the cap holds them)
        if member.peer and self._peers[member.peer] >= self.per_peer:
            if not self._evict(member.peer):
                return False
        if len(self._members) >= self.cap and not self._evict(None):
            return False
        self._members.add(member)
        self._peers[member.peer] += 1
        self._waiting[member] = None
        return True

    def note(self, member: Member, ready: bool, busy: bool) -> None:
        """Where a connection now stands: its preface received (``ready``), streams open."""
        if member not in self._members:
            return
        if ready and member in self._waiting:
            del self._waiting[member]
        elif not ready:
            return
        if busy:
            self._idle.pop(member, None)
        elif member not in self._idle:
            self._idle[member] = None  # idle from now: the newest

    def leave(self, member: Member) -> None:
        """The connection is gone (or going): it holds no place any more."""
        if member not in self._members:
            return
        self._members.discard(member)
        self._waiting.pop(member, None)
        self._idle.pop(member, None)
        self._peers[member.peer] -= 1
        if not self._peers[member.peer]:
            del self._peers[member.peer]

    def _evict(self, peer: str | None) -> bool:
        """Close the oldest waiting connection (of ``peer`` when given), else the one idle
        the longest; False when there is none."""
        for queue in (self._waiting, self._idle):
            for member in queue:
                if peer is None or member.peer == peer:
                    self.leave(member)
                    member.evict()
                    return True
        return False
