"""Small statistics helpers shared by the parts."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> float:
    """Seconds to milliseconds, rounded for the report."""
    return round(seconds * 1000.0, 2)
