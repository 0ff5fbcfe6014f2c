"""How long a swap will still take, from the pool's own history: the Retry-After we send."""

from __future__ import annotations

import math
from collections import deque

# Swap durations remembered per pool.
HISTORY_LENGTH = 16


class SwapHistory:
    """The last swap durations of one pool and the Retry-After they suggest."""

    def __init__(self, default: int, ceiling: int) -> None:
        self._durations: deque[float] = deque(maxlen=HISTORY_LENGTH)
        self._default = default
        self._ceiling = ceiling

    def record(self, seconds: float) -> None:
        """Remember a completed swap's duration."""
        self._durations.append(seconds)

    def retry_after(self, elapsed: float | None) -> int:
        """Seconds to wait: the expected rest of a swap ``elapsed`` seconds in (None: none).

        Without history, the configured default. A swap already slower than usual is
        expected to take as long as the slowest one seen, and once past even that, another
        half of a usual swap: never "1 s", which would invite a retry storm against a slow load.
        """
        if not self._durations:
            return self._default
        mean = sum(self._durations) / len(self._durations)
        expected = mean
        if elapsed is not None:
            total = mean if elapsed < mean else max(self._durations)
            expected = total - elapsed if elapsed < total else mean / 2
        return max(1, min(self._ceiling, math.ceil(expected)))
