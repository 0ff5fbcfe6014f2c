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
