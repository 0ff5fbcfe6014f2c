"""Swap notices from the ext_proc's JSON log: reading them, and one human line per notice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

SWAP_EVENTS = ("SwapStarted", "SwapCompleted", "SwapFailed", "SwapDeferred", "MemberLost",
               "ActuationChanged", "ReplicasWritten", "MemberAutoscaled", "Reclaimed")


def parse_line(line: str) -> dict[str, Any] | None:
    """A JSON log entry, or None for anything else (tracebacks, partial writes)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        return None
    return entry if isinstance(entry, dict) else None


def swap_notices(entries: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries that are swap notices, in log order (a follower replica's echo of its
    leader's swap is not one: the leader's is)."""
    return [e for e in entries if e.get("event") in SWAP_EVENTS and e.get("role") != "follower"]


def read_log(path: Path | str) -> list[dict[str, Any]]:
    """Every JSON entry of a log file written so far."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return [e for e in map(parse_line, text.splitlines()) if e is not None]


class LogTail:
    """Reads the JSON entries appended to a file since the last call (whole lines only)."""

    def __init__(self, path: Path | str, from_start: bool = False) -> None:
        self.path = Path(path)
        self.offset = 0 if from_start or not self.path.exists() else self.path.stat().st_size
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        """New complete entries; a line still being written waits for the next call."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data, self._partial = self._partial + data, b""
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" when the data ended with a newline
        entries = (parse_line(line.decode("utf-8", "replace")) for line in lines)
        return [e for e in entries if e is not None]


def describe(entry: dict[str, Any]) -> str:
    """One concise line for a swap notice: when, pool, from -> to, how long, how many held."""
    when = str(entry.get("ts", ""))[11:19]  # HH:MM:SS of the ISO timestamp
    pool = f"{entry.get('namespace', '?')}/{entry.get('pool', '?')}"
    source = entry.get("source") or "(none)"
    target = entry.get("target") or "(none)"
    kind = entry.get("event")
    took = f"{float(entry.get('duration_s') or 0):.1f}s"
    if kind == "SwapStarted":
        what = f"{source} -> {target}  swap started"
    elif kind == "SwapCompleted":
        held = int(entry.get("released") or 0)
        what = (f"{source} -> {target}  swapped in {took}, "
                f"{held} held request{'' if held == 1 else 's'} released")
    elif kind == "SwapFailed":
        what = f"{source} -> {target}  FAILED after {took}: {entry.get('msg', '')}"
    elif kind == "SwapDeferred":
        # the deferral's reason travels in `source` (PodsBusy, IdleCheckFailed ...)
        what = f"swap to {target} deferred ({entry.get('source') or '?'}): {entry.get('msg', '')}"
    elif kind == "MemberLost":
        what = f"resident lost: {entry.get('msg', '')}"
    else:
        what = str(entry.get("msg", ""))
    return f"{when}  {pool:<20} {what}"
