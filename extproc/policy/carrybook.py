"""The record of one pool's prompt-cache carry-over: which save or restore the swap waits for.

Data only; the rules are in ``carry.py``. Rules of this file: it owns ``CarryBook`` and
imports nothing of the policy; every change to it is one of its methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field


_NONE: dict[tuple[str, str], float] = {}  # (read only: what a swap without steps waits for)


@dataclass(slots=True)
class CarryBook:
    """Steps asked in the swap under way: (member, step) -> until when the swap waits."""

    swap_started: float = float("-inf")  # the swap the steps belong to
    waiting: dict[tuple[str, str], float] = field(default_factory=dict)
    finished: set[tuple[str, str]] = field(default_factory=set)  # answered or given up
    # members whose slots this process saved when they last gave up the slot: only those are
    # restored (a member that kept serving, or one saved by a process before a restart, not)
    saved: set[str] = field(default_factory=set)

    def of(self, started: float) -> "CarryBook":
        """This record if it belongs to the swap started at ``started``, else one with no
        steps (read only: the next ``ask`` starts the new swap's record)."""
        return self if self.swap_started == started else CarryBook(started, saved=self.saved)

    def waiting_in(self, started: float) -> dict[tuple[str, str], float]:
        """The steps the swap started at ``started`` waits for (none if it is not this one's)."""
        return self.waiting if self.swap_started == started else _NONE

    def ask(self, started: float, member: str, step: str, until: float) -> None:
        """The swap started at ``started`` waits for ``member``'s ``step`` until ``until``."""
        if self.swap_started != started:
            self.swap_started, self.waiting, self.finished = started, {}, set()
        self.waiting[(member, step)] = until
        self.saved.discard(member)  # a new save replaces it; a restore uses it up

    def skip(self, started: float, member: str, step: str) -> None:
        """``member``'s ``step`` is not taken in the swap started at ``started``."""
        self.ask(started, member, step, float("-inf"))
        self.finish(member, step)

    def keep(self, member: str) -> None:
        """``member``'s slots were saved: restore them when it loads again."""
        self.saved.add(member)

    def finish(self, member: str, step: str) -> bool:
        """``step`` of ``member`` is over (answered, or given up); False if none was waited for."""
        if self.waiting.pop((member, step), None) is None:
            return False
        self.finished.add((member, step))
        return True
