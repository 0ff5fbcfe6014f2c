"""Our writes that may still land: a member we asked up counts as possibly up until it shows.

A member the watch shows unloaded is not known to stay so while a scale-up or trigger of ours
to it may still reach the API server: the runtime's scaler keeps a wish until it sticks, and a
request already on the wire lands up to the API client's request timeout later
(``Limits.write_landing``). Loading another member meanwhile would put two on the GPU, and
forgetting a member removed from the pool meanwhile would leave it up with nobody tracking it
(tests/policy/test_exhaustive.py checks both). So a member asked up stays possibly up until

* the watch shows the write landed (replicas >= 1: from then on the usual unload, until its
  pods are gone, applies), or shows the member deleted;
* or, once the wish is withdrawn (own mode: our ``Scale(member, 0)``, which the scaler puts in
  place of an unsent 1) or was a single request (a trigger), ``write_landing`` has passed
  (a Tick comes then: ``deadlines``). The bound takes the watch to show a landed write
  within it; a removed member is forgotten only on a watch event after it (``respec``,
  ``PoolMachine._observe``), so a late event of a write that landed still finds it tracked;
* or the runtime dropped our wishes (``dropped``: hands-off, or the lead lost) before any
  scale-up asked since the entry opened was sent, or while every one sent was refused: then
  nothing of ours can bring the member up. Had one been sent, a standing wish becomes a
  withdrawn one. (Waiting out the bound there stalled the first swap after a hands-off
  spell for 60 s: the resumed machine withdrew a wish the runtime had already dropped.)
  Asks are counted per member on both sides (our ``Scale`` asks here, the scaler's wishes
  there), so the runtime names an ask by its number.

Rules of this file: it owns ``Landing`` (``m.landing``) and imports nothing of the policy's
rules; every change to it is one of its methods, called when we ask a member up or down
(``PoolMachine.scale``, ``steps_llmkube.trigger``), when the watch shows a member, and when
the runtime drops our wishes (``WishesDropped``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .model import MemberObservation


@dataclass(slots=True)
class Landing:
    """Members asked up that the watch has not shown up yet: member -> until when our write
    may still land (inf: our wish stands, the scaler still pushes it)."""

    until: dict[str, float] = field(default_factory=dict)
    asks: dict[str, int] = field(default_factory=dict)  # member -> our Scale asks so far
    opened: dict[str, int] = field(default_factory=dict)  # member -> the ask opening its entry

    def asked(self, member: str, replicas: int, now: float, bound: float,
              standing: bool = True) -> None:
        """We asked for ``member`` at ``replicas`` (``standing``: a wish the scaler keeps until
        it sticks; else one request, a trigger)."""
        self._drop_past(now)
        if standing:  # a Scale: the runtime's scaler counts it too (a trigger is not one)
            self.asks[member] = self.asks.get(member, 0) + 1
        if replicas > 0:
            if member not in self.until and standing:
                self.opened[member] = self.asks[member]
            self.until[member] = math.inf if standing else max(
                self.until.get(member, -math.inf), now + bound)
        elif member in self.until:
            # withdrawn: an unsent 1 is replaced, the one on the wire lands within the bound
            self.until[member] = min(self.until[member], now + bound)

    def seen(self, obs: MemberObservation, now: float) -> None:
        """The watch shows ``obs``: a write that shows (or a member deleted) is settled."""
        self._drop_past(now)
        if obs.replicas >= 1 or not obs.exists:
            self._settle(obs.name)

    def dropped(self, reached: dict[str, int], now: float, bound: float) -> None:
        """The runtime dropped every wish of ours; ``reached``: per member, the latest ask whose
        scale-up may have reached the API server (none: settled; else it lands by the bound)."""
        self._drop_past(now)
        for member, until in list(self.until.items()):
            if reached.get(member, 0) < self.opened.get(member, 0):
                self._settle(member)
            elif until == math.inf:
                self.until[member] = now + bound

    def may_land(self, member: str, now: float) -> bool:
        """A write of ours may still bring ``member`` up."""
        return self.until.get(member, -math.inf) > now

    def standing(self, member: str) -> bool:
        """Our wish for ``member`` up still stands (own mode: withdraw it to unload it)."""
        return self.until.get(member) == math.inf

    def deadlines(self, now: float) -> list[float]:
        """When a withdrawn write stops counting (a Tick then lets what waited on it go on)."""
        return [t for t in self.until.values() if now < t < math.inf]

    def _settle(self, member: str) -> None:
        self.until.pop(member, None)
        self.opened.pop(member, None)

    def _drop_past(self, now: float) -> None:
        for member in [n for n, t in self.until.items() if t <= now]:
            self._settle(member)
