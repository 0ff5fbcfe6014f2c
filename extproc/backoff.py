"""Jittered exponential backoff, shared by every retry loop (watches, status, scaling)."""

from __future__ import annotations

import random


class Backoff:
    """Exponential delays with full jitter, so many clients do not retry in lockstep."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self._attempt = 0

    def next_delay(self) -> float:
        """The delay before the next attempt; grows with each call until ``reset``."""
        ceiling = min(self.maximum, self.initial * (2 ** self._attempt))
        self._attempt += 1
        # Never below half the ceiling: a near-zero delay right after a failure is a busy loop.
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """Start over from the initial delay (after a success)."""
        self._attempt = 0
