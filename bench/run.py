"""``make bench``: run the five parts in one go and write the results down.

Every figure is a ratio or a difference between two things measured in this same run. The
whole run is bounded (fixed durations and counts, timeouts on every wait): about 9 minutes
on this machine, 4 of them part 5. Part 2 runs the same swaps in both actuation modes, own and
llmkube; part 5 runs 3 ext_proc replicas side by side with 1. ``python -m bench.run --only
llmkube`` runs just part 2's llmkube half (``--only swap`` its own-mode half), ``--only ha``
just part 5, and merges it into the last run's bench/results.json (the other parts keep
their figures). With
``MODELPOOL_BENCH_PEER`` set to Envoy AI Gateway's ext_proc binary, part 1b measures it beside
ours in the same run (``--only peer`` alone). Part 6 (hand-offs per request for each way of
running the service) runs only alone, ``--only handoffs``, and so does part 7 (warm swaps,
``--only warm``), and part 2c (part 2's swaps on llama.cpp's own servers, ``make
llama-server`` first: ``--only llama``), and part 8 (attacks on the gRPC port, ``--only
attacks``); a full run keeps their last figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import (ablation, attacks, fleet, fleet_swaps, ha, handoffs, held, hotpath, machine, overhead, peer,
               report, swap, tools, warm)

# Part 1: seconds per wrk run, after a warm-up of its own.
WRK_SECONDS, WRK_WARMUP = 10, 3
# Part 2: swaps, concurrent held requests per swap, simulated delays (s), time cap (s).
SWAPS, HELD_PER_SWAP, LOAD_DELAY, UNLOAD_DELAY, SWAP_BUDGET = 60, 3, 0.2, 0.1, 180
# Part 2c: swaps on real llama.cpp members (each starts a server and loads a model).
LLAMA_SWAPS = 20
# Part 3: h2load streams per connection; connections opened per second when ramping.
STREAMS, RAMP_CONNECTIONS_PER_S = 100, 5

Part = Callable[[], dict[str, object]]


def _llama_swaps(work: Path) -> dict[str, object]:
    """Part 2c: part 2's swaps on llama.cpp's own servers (``make llama-server``), no delays
    (the ``sim_*`` figures are then the real server's start, load and stop), and part 7's warm
    swaps on them."""
    result: dict[str, object] = {
        mode: swap.run(work / f"swap-llama-{mode}", LLAMA_SWAPS, HELD_PER_SWAP, 0.0, 0.0,
                       SWAP_BUDGET, actuation=mode, runtime="llama.cpp")
        for mode in ("own", "llmkube")}
    result["warm"] = warm.run(work / "warm-llama", warm.llama_members())
    return result


def _stamped(run: Callable[[], dict[str, object]], versions: dict[str, str]
             ) -> dict[str, object]:
    """Run one part, its result stamped with its date, commit and duration (a part can run
    alone, and is merged into the last run's results)."""
    began = time.monotonic()
    result = run()
    facts = machine.facts(versions)
    result["measured"] = {"date": facts["date"], "git_commit": facts["git_commit"],
                          "elapsed_s": round(time.monotonic() - began, 1)}
    return result


def _alone(work: Path, peer_binary: str | None) -> dict[str, tuple[str, Part]]:
    """The parts ``--only`` runs, each with the line that announces it."""
    return {
        "peer": ("1b ours beside the Go peer",
                 lambda: peer.run(work / "peer", peer_binary or "")),
        "ablation": ("1c what each part of our Envoy config costs, by its absence",
                     lambda: ablation.run(work / "ablation")),
        "attacks": ("8 a healthy client beside each attack",
                    lambda: attacks.run(work / "attacks")),
        "warm": ("7 warm swaps, carry-over and paced release", lambda: warm.run(work / "warm")),
        "handoffs": ("6 hand-offs per request, variants side by side",
                     lambda: handoffs.run(work / "handoffs")),
        "swap": ("2/5 swap release latency and overhead, own mode only",
                 lambda: swap.run(work / "swap", SWAPS, HELD_PER_SWAP, LOAD_DELAY,
                                  UNLOAD_DELAY, SWAP_BUDGET)),
        "llama": ("2c swaps on real llama.cpp members, both modes",
                  lambda: _llama_swaps(work)),
        "llmkube": ("2/5 swap trigger and release latency, llmkube mode only",
                    lambda: swap.run(work / "swap-llmkube", SWAPS, HELD_PER_SWAP, LOAD_DELAY,
                                     UNLOAD_DELAY, SWAP_BUDGET, actuation="llmkube")),
        "ha": ("5/5 several replicas, 3 beside 1", lambda: ha.run(work / "ha")),
        "fleet": ("fleet: 1, 100 and 1,000 pools at rest, and swapping, on a real "
                  "kube-apiserver",
                  lambda: fleet.run(work / "fleet") | fleet_swaps.run(work / "fleet-swaps")),
    }


def _finish(results: dict, work: Path) -> None:
    report.write(results)
    for target, measured, limit, met in report.targets(results):
        print(f"  {'met   ' if met else 'MISSED'} {target}: {measured} (target {limit})")
    print(f"bench: wrote {report.RESULTS} and {report.DOC}")
    shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """Run everything (or ``--only`` one part) in a scratch directory (kept on failure)."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--only", choices=tuple(_alone(Path(), None)),
                        help="run only this part and merge it into bench/results.json "
                        "(swap: part 2's own-mode half, about 1 minute; llama: part 2c, part "
                        "2's swaps and part 7's warm swaps on real llama.cpp members, about 4 "
                        "minutes; handoffs: part 6, context switches and CPU per request for "
                        "each way of running the service, about 5 minutes; not in the full run; "
                        "ablation: part 1c, what each part of our Envoy config costs by its "
                        "absence, about 3 minutes, not in the full run; "
                        "warm: part 7, prompt-cache carry-over and paced release, about 2 "
                        "minutes, not in the full run; attacks: part 8, a healthy client "
                        "beside each attack on the gRPC port, about 2 minutes, not in the full "
                        "run; fleet: N pools x replicas at rest on a real kube-apiserver "
                        "(make kube-tools), about 10 minutes, not in the full run; "
                        f"peer: part 1b, about 5 minutes, needs ${peer.PEER_ENV})")
    only = parser.parse_args(argv).only
    peer_binary = os.environ.get(peer.PEER_ENV)
    if only == "peer" and not peer_binary:
        parser.error(f"--only peer needs ${peer.PEER_ENV}: the path of Envoy AI Gateway's "
                     "ext_proc binary (see docs/benchmarks.md)")
    began = time.monotonic()
    versions = tools.ensure_tools()
    work = Path(tempfile.mkdtemp(prefix="modelpool-bench-"))
    print(f"bench: working in {work}", flush=True)
    parts = _alone(work, peer_binary)
    if only is not None:
        results = json.loads(report.RESULTS.read_text(encoding="utf-8"))
        label, run_part = parts[only]
        print(f"bench: {label}", flush=True)
        results[only] = _stamped(run_part, versions)
        _finish(results, work)
        return
    print("bench: 1/5 resident-hit overhead", flush=True)
    results = {"overhead": overhead.run(work / "overhead", WRK_SECONDS, WRK_WARMUP)}
    if peer_binary:
        print("bench: 1b ours beside the Go peer", flush=True)
        results["peer"] = _stamped(parts["peer"][1], versions)
    print("bench: 2/5 swap release latency, own and llmkube mode", flush=True)
    results["swap"] = swap.run(work / "swap", SWAPS, HELD_PER_SWAP, LOAD_DELAY, UNLOAD_DELAY,
                               SWAP_BUDGET)
    results["llmkube"] = _stamped(parts["llmkube"][1], versions)
    print("bench: 3/5 held at scale", flush=True)
    # Ramped arrivals measure holding; the burst shows what an all-at-once arrival does.
    runs = held.run(work / "held-ramp", (2000, 10_000), STREAMS, RAMP_CONNECTIONS_PER_S)
    runs += held.run(work / "held-burst", (10_000,), STREAMS, 0)
    largest = max((r for r in runs if "error" not in r), key=lambda r: r["n"], default={})
    results["held"] = {**{k: largest.get(k) for k in (
        "n", "sent", "rss_mb", "rss_peak_mb", "release_all_ms", "release_p50_ms",
        "cpu_admit_s", "cpu_idle_hold_s_per_s", "cpu_release_s")}, "runs": runs}
    print("bench: 4/5 API calls on the hot path", flush=True)
    results["hotpath"] = hotpath.run(work / "hotpath")
    print("bench: 5/5 several replicas, 3 beside 1", flush=True)
    results["ha"] = _stamped(parts["ha"][1], versions)
    results["machine"] = machine.facts(versions)
    results["elapsed_s"] = round(time.monotonic() - began, 1)
    if report.RESULTS.exists():
        # parts 6 and 7 run only alone, part 1b only with the peer binary: a run without them
        # keeps their last figures (each stamped with its own date and commit)
        last = json.loads(report.RESULTS.read_text(encoding="utf-8"))
        for part in ("handoffs", "ablation", "warm", "peer", "attacks", "llama", "fleet"):
            if part not in results and last.get(part) is not None:
                results[part] = last[part]
    _finish(results, work)


if __name__ == "__main__":
    main()
