"""The member simulator's own record of what it did and when (in process and as JSON lines).

Each entry is one JSON object per line::

    {"t": 1234.567891, "wall": 1732900000.123, "namespace": "demo", "member": "judge",
     "event": "pod_created", "pod": "judge-x7k2q"}

``t`` is ``time.monotonic()``. On Linux that clock is system wide, so a test process on the
same host can compare it with its own ``time.monotonic()`` readings. ``pod`` is present on pod
events. Event names are the ``EVENTS`` below.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EVENTS = (
    "pod_created",  # a Pod object for the member exists from now on
    "pod_terminating",  # scale-down started: the pod is marked terminating, it still holds the slot
    "pod_killed",  # the pod died out of band (kill-pod annotation or external deletion)
    "pod_deleted",  # the Pod object is gone from the API
    "server_started",  # the fake upstream answers /health on the member's port
    "server_stopped",  # the fake upstream process has exited
    "ready",  # status.phase Ready was written
    "failed",  # status.phase Failed was written
    "stopped",  # status.phase Stopped was written
    "adopted",  # a surviving Ready pod got a fresh server after a simulator restart
)


@dataclass(frozen=True)
class TimelineEvent:
    """One thing the simulator did to one member."""

    t: float
    wall: float
    namespace: str
    member: str
    event: str
    pod: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """One JSON line (no trailing newline); empty fields are left out."""
        entry = {k: v for k, v in asdict(self).items() if k != "extra" and v is not None}
        entry.update(self.extra)
        return json.dumps(entry, separators=(",", ":"))


class Timeline:
    """An append-only list of events, mirrored line by line to an optional file."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.events: list[TimelineEvent] = []
        self.path = Path(path) if path else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, namespace: str, member: str, event: str, pod: str | None = None,
               **extra: Any) -> TimelineEvent:
        """Append one event now and write it through to the file."""
        if event not in EVENTS:
            raise ValueError(f"unknown timeline event {event!r}")
        entry = TimelineEvent(time.monotonic(), time.time(), namespace, member, event, pod, extra)
        self.events.append(entry)
        if self.path:
            # append and close per line: readers (tests, other processes) see every event at once
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(entry.to_json() + "\n")
        return entry

    def of(self, member: str, event: str | None = None) -> list[TimelineEvent]:
        """Events of one member, optionally of one kind, oldest first."""
        return [e for e in self.events
                if e.member == member and (event is None or e.event == event)]


def read_timeline(path: str | Path) -> list[dict[str, Any]]:
    """Load a timeline file written by another process."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
