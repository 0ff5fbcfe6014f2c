"""Facts about the machine and software a run was measured on."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys

from devstack.envoyproc import envoy_binary
from devstack.procs import PROJECT_ROOT


def _first_line(args: list[str]) -> str:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else ""


def _cpu_model() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _memory_gib() -> float:
    with open("/proc/meminfo", encoding="ascii") as fh:
        kib = int(fh.readline().split()[1])  # MemTotal is the first line
    return round(kib / 1024 / 1024, 1)


def facts(tools: dict[str, str]) -> dict[str, object]:
    """nproc, CPU, memory, kernel, Python, Envoy and load tool versions, date, git commit."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "envoy": _first_line([str(envoy_binary()), "--version"]).split("version:")[-1].strip(),
        "git_commit": _first_line(["git", "-C", str(PROJECT_ROOT), "rev-parse", "--short",
                                   "HEAD"]),
        **tools,
    }
