"""Resource use of a process from /proc: resident memory and CPU seconds."""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak) of ``pid`` in MiB."""
    values: dict[str, float] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024.0
    return values


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        # The command name (field 2) may hold spaces; count fields after its closing paren.
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and every descendant: the live ones as they stand, the reaped ones
    through their parent's cumulative children's time."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15]) / _TICKS  # utime, stime, cutime, cstime
    for child in _children(pid):
        try:
            total += tree_cpu_seconds(child)
        except (FileNotFoundError, ProcessLookupError):
            pass  # exited meanwhile: its time is in cutime once reaped
    return total


def busy_seconds() -> float:
    """CPU time every core of the machine has spent busy (not idle nor waiting on I/O)."""
    with open("/proc/stat", encoding="ascii") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / _TICKS


def _children(pid: int) -> list[int]:
    """The live children of ``pid`` (every thread's)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fh:
                found += [int(c) for c in fh.read().split()]
        except FileNotFoundError:
            continue
    return found
