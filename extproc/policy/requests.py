"""The request book of one pool: which requests are held, which are in flight, and since when.

Data and bookkeeping only. The machine (``machine.py``) decides what happens to a request;
this class remembers the outcome so that every count (held, in flight, busy per member, the
time a member last went idle) has exactly one owner, and the runtime and the metrics read
them from here instead of keeping copies.

Rules of this file: it owns ``RequestBook`` and reads nothing of the pool; every change to it
is one of its methods, called by the machine and by the concerns that answer held requests.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from .state import PolicyError

# Returns remembered per member: enough to see a pattern, few enough to forget an old one.
RETURNS_KEPT = 8
# The drain linger is twice the longest recent gap: a returning client's pauses jitter (its
# own work, a loaded machine), and missing it costs two swaps where waiting costs milliseconds.
LINGER_FACTOR = 2.0
# ... and at least this share of the cap: a loaded machine adds tens of milliseconds to every
# gap whatever its size (scheduling, the proxy's own work), which a factor alone never covers.
LINGER_FLOOR_SHARE = 0.1
# Returns older than this many drain-linger caps (10 s at the default 0.5 s) are forgotten:
# the clients that made them are likely gone.
LINGER_MEMORY = 20.0


@dataclass(slots=True)
class Held:
    """A request waiting for its member to become resident."""

    member: str
    arrived: float
    deadline: float
    priority: int = 0  # who gets the slot next (priority.py): higher first


class RequestBook:
    """Held and in-flight requests of one pool, with per-member counts and a deadline heap."""

    def __init__(self) -> None:
        self.held: dict[int, Held] = {}  # insertion order is arrival order: oldest first
        self.in_flight: dict[int, str] = {}
        self.held_by: dict[str, int] = {}  # member -> requests held for it (gauges read it)
        self._busy: dict[str, int] = {}
        self._idle_since: dict[str, float] = {}  # when each member's last request ended
        self._last_end: dict[str, float] = {}  # when any request of each member last ended
        # member -> (when, gap) of recent arrivals that came soon after one of its requests
        # ended: the sign of clients that send back to back (see return_gap).
        self._returns: dict[str, deque[tuple[float, float]]] = {}
        # (member, when) of the latest admission of the two members admitted most recently,
        # newest first: enough to tell, for any member, when another one was last admitted.
        self._latest_admits: list[tuple[str, float]] = []
        # (deadline, rid) of held requests; entries of requests no longer held are skipped
        # lazily, so every event costs O(log n) even with thousands of requests parked.
        self._deadlines: list[tuple[float, int]] = []
        # The member that last took the slot by a swap, the requests admitted to it since,
        # counted up to its minimum residency only (residency.py): a bounded count.
        self._slot: tuple[str, int, int] = ("", 0, 0)  # (member, served, cap)

    # ---- what the machine asks ------------------------------------------------------------

    def knows(self, rid: int) -> bool:
        """Whether ``rid`` is held or in flight."""
        return rid in self.held or rid in self.in_flight

    def busy(self, member: str) -> int:
        """Requests in flight on ``member``."""
        return self._busy.get(member, 0)

    def idle_since(self, member: str) -> float:
        """When ``member``'s last request ended (-inf if it never served one)."""
        return self._idle_since.get(member, -math.inf)

    def linger(self, member: str, now: float, cap: float) -> float:
        """How long ``member`` should keep the slot after its last request, at most ``cap``.

        Only clients seen coming back (a request arriving within ``cap`` after one ended, in
        the last LINGER_MEMORY caps) earn a linger: LINGER_FACTOR times their longest recent
        gap, at least LINGER_FLOOR_SHARE of ``cap``. An incumbent without returning clients
        gives the slot up at once.
        """
        since = now - LINGER_MEMORY * cap
        gap = max((gap for when, gap in self._returns.get(member, ()) if when >= since),
                  default=None)
        if gap is None:
            return 0.0
        return min(cap, max(LINGER_FLOOR_SHARE * cap, LINGER_FACTOR * gap))

    def served_in_slot(self, member: str) -> int:
        """Requests admitted to ``member`` since it took the slot (counted up to the cap)."""
        name, served, _ = self._slot
        return served if name == member else 0

    def held_for(self, member: str) -> Iterator[tuple[int, Held]]:
        """The requests held for ``member``, oldest first (a snapshot: safe to change the book)."""
        return iter([(rid, h) for rid, h in self.held.items() if h.member == member])

    def next_deadline(self) -> float:
        """The earliest deadline of a held request (inf if none)."""
        heap = self._deadlines
        while heap and not self._is_current(*heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    # ---- what the machine records -----------------------------------------------------------

    def arrived(self, member: str, now: float, horizon: float) -> None:
        """A request for ``member`` arrived: a return if one of its requests ended at most
        ``horizon`` seconds ago (a longer pause is a new client, not one coming back) and no
        other member was admitted a request in between."""
        ended = self._last_end.get(member, -math.inf)
        # A client that waited for another member's answer before coming back (one that
        # alternates between models) gains nothing from a linger: it would only come back
        # after the swap the linger delays. Counting it would make every such swap wait.
        if now - ended <= horizon and self._admitted_elsewhere(member) <= ended:
            gap = now - ended
            returns = self._returns.get(member)
            if returns is None:
                returns = self._returns[member] = deque(maxlen=RETURNS_KEPT)
            returns.append((now, gap))

    def hold(self, rid: int, member: str, now: float, deadline: float,
             priority: int = 0) -> None:
        """Park ``rid`` for ``member`` until ``deadline``, at ``priority``."""
        self.held[rid] = Held(member, now, deadline, priority)
        self.held_by[member] = self.held_by.get(member, 0) + 1
        heapq.heappush(self._deadlines, (deadline, rid))

    def unhold(self, rid: int) -> Held:
        """Take ``rid`` out of the held set (it is about to be admitted or answered)."""
        return self._take(rid)

    def admit(self, rid: int, member: str, now: float) -> None:
        """Count ``rid`` in flight on ``member`` from ``now``."""
        self.in_flight[rid] = member
        self._busy[member] = self._busy.get(member, 0) + 1
        latest = self._latest_admits
        if latest and latest[0][0] == member:
            latest[0] = (member, now)
        else:
            self._latest_admits = [(member, now), *latest[:1]]
        name, served, cap = self._slot
        if name == member and served < cap:
            self._slot = (name, served + 1, cap)

    def took_slot(self, member: str, cap: int) -> None:
        """``member`` took the slot by a swap: count its next ``cap`` admissions."""
        self._slot = (member, 0, cap)

    def end(self, rid: int, now: float) -> Held | None:
        """The request's stream closed: None if it was in flight, its Held if it was held."""
        member = self.in_flight.pop(rid, None)
        if member is not None:
            self._last_end[member] = now
            self._busy[member] -= 1
            if not self._busy[member]:
                self._idle_since[member] = now
            return None
        if rid not in self.held:
            raise PolicyError(f"request {rid} ended but is neither held nor in flight")
        return self._take(rid)

    def expired(self, now: float) -> Iterator[tuple[int, Held]]:
        """Take out and yield every held request whose deadline is at or before ``now``."""
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, rid = heapq.heappop(heap)
            if self._is_current(deadline, rid):
                yield rid, self._take(rid)

    def _admitted_elsewhere(self, member: str) -> float:
        """When a member other than ``member`` was last admitted a request (-inf: never)."""
        for other, when in self._latest_admits:
            if other != member:
                return when
        return -math.inf

    def _take(self, rid: int) -> Held:
        held = self.held.pop(rid)
        left = self.held_by[held.member] - 1
        if left:
            self.held_by[held.member] = left
        else:
            del self.held_by[held.member]
        return held

    def _is_current(self, deadline: float, rid: int) -> bool:
        # Request ids are reused once a request ends: an entry is stale unless that rid is
        # held now *with this deadline*, else a reused rid would expire on its old deadline.
        held = self.held.get(rid)
        return held is not None and held.deadline == deadline
