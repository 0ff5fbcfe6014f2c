"""What one peer may ask of the server per unit of time before it is told to calm down.

Frames that make the server work without giving it anything to serve (PING, SETTINGS,
PRIORITY, WINDOW_UPDATE, unknown types, empty DATA, streams refused after GOAWAY) draw on one
budget; streams the peer resets while they are open (HTTP/2 rapid reset, CVE-2023-44487) draw
on another. Each budget is a token bucket: a burst, refilled at a steady rate. Past the
control budget the connection ends (GOAWAY ENHANCE_YOUR_CALM); past the reset budget it is
drained, not cut: no new stream, the open ones run to their end. Envoy resets an ext_proc
stream when its client gives up, and a crowd of held clients may give up at once; none of
their requests may be lost for it.

The figures sit far above what Envoy sends (a PING per keepalive interval, one SETTINGS, a
WINDOW_UPDATE per half window it reads) and far below what hurts: a flood frame costs the
loop a few microseconds, so the control budget's rate is a few milliseconds of CPU a second.
"""

from __future__ import annotations

from typing import Callable

CONTROL_BURST = 4000.0
CONTROL_PER_SECOND = 2000.0
RESET_BURST = 2000.0
RESET_PER_SECOND = 500.0


class Bucket:
    """A token bucket on an injected clock."""

    __slots__ = ("_clock", "_burst", "_rate", "_tokens", "_at")

    def __init__(self, clock: Callable[[], float], burst: float, rate: float) -> None:
        self._clock, self._burst, self._rate = clock, burst, rate
        self._tokens, self._at = burst, clock()

    def take(self, count: int = 1) -> bool:
        """Spend ``count`` tokens; False (and nothing spent) when fewer are left."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < count:
            return False
        self._tokens -= count
        return True


class Calm:
    """One connection's budgets: control frames, and streams the peer resets."""

    __slots__ = ("_control", "_resets")

    def __init__(self, clock: Callable[[], float], *, control_burst: float = CONTROL_BURST,
                 control_rate: float = CONTROL_PER_SECOND, reset_burst: float = RESET_BURST,
                 reset_rate: float = RESET_PER_SECOND) -> None:
        self._control = Bucket(clock, control_burst, control_rate)
        self._resets = Bucket(clock, reset_burst, reset_rate)

    def control_frame(self, count: int = 1) -> bool:
        """Frames (or a frame's parts) that ask work and serve nothing; False past the budget."""
        return self._control.take(count)

    def peer_reset(self) -> bool:
        """The peer reset an open stream; False past the budget."""
        return self._resets.take()
