"""Minimum residency counted in requests: a new resident is not swapped out between two of
its first requests.

After a swap, the member that took the slot serves at least ``spec.min_residency`` requests
(the annotation ``modelpool.inference.llmkube.dev/min-residency``; 0: off) before a swap away
from it may unload it at a pause between two of them: until then, while a swap waits, it keeps
the slot for the whole drain linger cap (``--drain-linger``) after each of its requests, not
only for clients seen coming back (``requests.RequestBook.linger``). Nothing else changes: a
request in flight is always drained first; once nothing has wanted it for the cap, it gives
the slot up ("until nothing waits for it"); and once the swap has waited the pool's fairness
window, new requests for it are held and the slot moves (``fairness.py``: the window bounds
every wait, the residency never stretches it). Requests are counted on this replica.

Rules of this file: it owns no state (the count is the request book's, bounded by the
residency) and changes nothing; it reads the pool through ``pool.PoolReader``.
"""

from __future__ import annotations

from .pool import PoolReader


def owed(m: PoolReader, member: str) -> int:
    """Requests ``member`` must still serve before its minimum residency is met (0: none)."""
    if member != m.resident:
        return 0
    return max(0, m.spec.min_residency - m.requests.served_in_slot(member))


def linger(m: PoolReader, member: str, cap: int | float) -> float:
    """How long ``member`` keeps the slot after its last request while a swap waits: the
    whole cap while its residency is owed, else its adaptive drain linger."""
    return cap if owed(m, member) else m.requests.linger(member, m.now, cap)
