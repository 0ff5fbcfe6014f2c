"""``make bench``: run the four parts in one go and write the results down.

Every figure is a ratio or a difference between two things measured in this same run. The
whole run is bounded (fixed durations and counts, timeouts on every wait): about 3 minutes
on this machine.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from . import held, hotpath, machine, overhead, report, swap, tools

# Part 1: seconds per wrk run, after a warm-up of its own.
WRK_SECONDS, WRK_WARMUP = 10, 3
# Part 2: swaps, concurrent held requests per swap, simulated delays (s), time cap (s).
SWAPS, HELD_PER_SWAP, LOAD_DELAY, UNLOAD_DELAY, SWAP_BUDGET = 60, 3, 0.2, 0.1, 180
# Part 3: h2load streams per connection; connections opened per second when ramping.
STREAMS, RAMP_CONNECTIONS_PER_S = 100, 5


def main() -> None:
    """Run everything in a scratch directory (kept on failure for its logs)."""
    began = time.monotonic()
    versions = tools.ensure_tools()
    work = Path(tempfile.mkdtemp(prefix="modelpool-bench-"))
    print(f"bench: working in {work}", flush=True)
    print("bench: 1/4 resident-hit overhead", flush=True)
    results = {"overhead": overhead.run(work / "overhead", WRK_SECONDS, WRK_WARMUP)}
    print("bench: 2/4 swap release latency", flush=True)
    results["swap"] = swap.run(work / "swap", SWAPS, HELD_PER_SWAP, LOAD_DELAY, UNLOAD_DELAY,
                               SWAP_BUDGET)
    print("bench: 3/4 held at scale", flush=True)
    # Ramped arrivals measure holding; the burst shows what an all-at-once arrival does.
    runs = held.run(work / "held-ramp", (2000, 10_000), STREAMS, RAMP_CONNECTIONS_PER_S)
    runs += held.run(work / "held-burst", (10_000,), STREAMS, 0)
    largest = max((r for r in runs if "error" not in r), key=lambda r: r["n"], default={})
    results["held"] = {**{k: largest.get(k) for k in (
        "n", "sent", "rss_mb", "rss_peak_mb", "release_all_ms", "release_p50_ms",
        "cpu_admit_s", "cpu_idle_hold_s_per_s", "cpu_release_s")}, "runs": runs}
    print("bench: 4/4 API calls on the hot path", flush=True)
    results["hotpath"] = hotpath.run(work / "hotpath")
    results["machine"] = machine.facts(versions)
    results["elapsed_s"] = round(time.monotonic() - began, 1)
    report.write(results)
    for target, measured, limit, met in report.targets(results):
        print(f"  {'met   ' if met else 'MISSED'} {target}: {measured} (target {limit})")
    print(f"bench: wrote {report.RESULTS} and {report.DOC} in {results['elapsed_s']:.0f} s")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
