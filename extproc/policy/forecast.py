"""How long a swap will take, from the pool's own history: Retry-After and expected waits.

Durations are kept per (from, to) pair, because loading a 70B model after unloading a 7B one
takes far longer than the reverse. A pair never seen falls back to the pool's history (every
pair), and a pool that never swapped to the configured default.

Rules of this file: it owns ``SwapHistory`` (changed only by ``record``, when a swap completes)
and reads nothing of the pool.
"""

from __future__ import annotations

import math
from collections import deque

# Swap durations remembered per pair and per pool.
HISTORY_LENGTH = 16


class SwapHistory:
    """The last swap durations of one pool, per (from, to) pair, and what they predict."""

    def __init__(self, default: int, ceiling: int) -> None:
        self._pool: deque[float] = deque(maxlen=HISTORY_LENGTH)
        self._pairs: dict[tuple[str, str], deque[float]] = {}
        self._default = default
        self._ceiling = ceiling

    def record(self, source: str, target: str, seconds: float) -> None:
        """Remember a completed swap's duration (``source`` "" for a cold start)."""
        self._pool.append(seconds)
        pair = self._pairs.get((source, target))
        if pair is None:
            pair = self._pairs[(source, target)] = deque(maxlen=HISTORY_LENGTH)
        pair.append(seconds)

    def expected(self, source: str, target: str, elapsed: float | None = None) -> float:
        """Seconds still to go of a ``source`` -> ``target`` swap ``elapsed`` in (None: not begun).

        A swap already slower than usual is expected to take as long as the slowest one seen,
        and once past even that, another half of a usual swap: never "almost done", which
        would invite a retry storm against a slow load.
        """
        durations = self._pairs.get((source, target)) or self._pool
        if not durations:
            return float(self._default)
        mean = sum(durations) / len(durations)
        if elapsed is None:
            return mean
        total = mean if elapsed < mean else max(durations)
        return total - elapsed if elapsed < total else mean / 2

    def retry_after(self, source: str, target: str, elapsed: float | None = None) -> int:
        """``expected`` as a Retry-After: whole seconds, at least 1, at most the ceiling; the
        configured default as it is while the pool has no history."""
        if not self._pool:
            return self._default
        return self.clamp(self.expected(source, target, elapsed))

    def clamp(self, seconds: float) -> int:
        """Seconds as a Retry-After value: rounded up, at least 1, at most the ceiling."""
        return max(1, min(self._ceiling, math.ceil(seconds)))
