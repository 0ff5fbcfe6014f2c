"""Part 8: a healthy client beside each attack on the gRPC port (``--only attacks``).

``serve`` on a pools file (uvloop, the native server) alone on the machine; for each attack of
devstack/h2attacks.py, run for a few seconds from a process of its own, a healthy client checks
health every 20 ms and the server's CPU and resident memory are read from /proc before, at the
peak and once the attack is over. The first row is the same client with no attack.

``MODELPOOL_BENCH_ATTACKS`` (names, comma-separated) runs only those attacks: their rows
replace the same attacks' rows of the last run, the others are kept as they were.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from devstack.h2attacks import ATTACKS, Prober, launch
from devstack.procs import LOCALHOST, PROJECT_ROOT, free_port, wait_for_port

from . import report
from .procstat import cpu_seconds, memory_mb

SECONDS = 4.0
SETTLE = 1.0  # after an attack, before memory is read again
# ... and after these: 50,000 calls unwind over seconds, then the server's next look at them
# (every 5 s, extproc/transport/trim.py) gives their memory back
SETTLE_LONGER = {"fifty-thousand-streams-spread": 12.0}
ONLY_ENV = "MODELPOOL_BENCH_ATTACKS"
POOLS = "pools:\n- name: shared-gpu\n  namespace: demo\n  members: [judge, coder]\n"


def _one(name: str, pid: int, port: int) -> dict[str, Any]:
    before_cpu, before = cpu_seconds(pid), memory_mb(pid)["VmRSS"]
    peak = before
    with Prober(f"{LOCALHOST}:{port}") as prober:
        time.sleep(0.2)
        attacker = launch(name, LOCALHOST, port, SECONDS) if name != "none" else None
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline or (attacker and attacker.poll() is None
                                              and time.monotonic() < deadline + 30):
            peak = max(peak, memory_mb(pid)["VmRSS"])
            time.sleep(0.1)
        if attacker is not None:
            attacker.kill()
            attacker.wait()
    cpu = cpu_seconds(pid) - before_cpu
    time.sleep(SETTLE_LONGER.get(name, SETTLE))
    lat = sorted(x * 1000 for x in prober.latencies)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {"attack": name, "date": when, "probes": len(lat), "lost": len(prober.lost),
            "p50_ms": round(statistics.median(lat), 2) if lat else None,
            "p99_ms": round(prober.p99() * 1000, 2), "max_ms": round(max(lat), 2) if lat else None,
            "fresh_ok": prober.fresh_ok, "fresh_failed": len(prober.fresh_failed),
            "server_cpu_s": round(cpu, 2), "rss_before_mb": round(before, 1),
            "rss_peak_mb": round(peak, 1), "rss_after_mb": round(memory_mb(pid)["VmRSS"], 1)}


def run(work: Path) -> dict[str, Any]:
    """Every attack in turn (or those of ``MODELPOOL_BENCH_ATTACKS``) against one server;
    one row each."""
    only = [name for name in os.environ.get(ONLY_ENV, "").split(",") if name]
    unknown = sorted(set(only) - set(ATTACKS))
    if unknown:
        raise SystemExit(f"bench: no such attack {', '.join(unknown)} in ${ONLY_ENV}")
    work.mkdir(parents=True, exist_ok=True)
    pools = work / "pools.yaml"
    pools.write_text(POOLS, encoding="utf-8")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "extproc", "serve", "--pools-file", str(pools),
         "--listen", f"{LOCALHOST}:{port}", "--metrics-listen", ""],
        cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(LOCALHOST, port, timeout=30)
        rows = []
        for name in ["none", *sorted(only or ATTACKS)]:
            rows.append(_one(name, proc.pid, port))
            print(f"  {name:24} {rows[-1]}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if only:
        rows = _merged(rows)
    return {"seconds": SECONDS, "probe_every_ms": 20, "rows": rows}


def _merged(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last run's rows (each with the date it was measured), those measured now in place
    of theirs (in the order of names)."""
    last = {}
    if report.RESULTS.exists():
        part = json.loads(report.RESULTS.read_text(encoding="utf-8")).get("attacks") or {}
        when = part.get("measured", {}).get("date", "?")
        last = {row["attack"]: {"date": when, **row} for row in part.get("rows", [])}
    last.update({row["attack"]: row for row in rows})
    return [last["none"], *(last[name] for name in sorted(last) if name != "none")]
