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
from pathlib import Path

from . import (ablation, attacks, ha, handoffs, held, hotpath, machine, overhead, peer, report, swap,
               tools, warm)

# Part 1: seconds per wrk run, after a warm-up of its own.
WRK_SECONDS, WRK_WARMUP = 10, 3
# Part 2: swaps, concurrent held requests per swap, simulated delays (s), time cap (s).
SWAPS, HELD_PER_SWAP, LOAD_DELAY, UNLOAD_DELAY, SWAP_BUDGET = 60, 3, 0.2, 0.1, 180
# Part 2c: swaps on real llama.cpp members (each starts a server and loads a model).
LLAMA_SWAPS = 20
# Part 3: h2load streams per connection; connections opened per second when ramping.
STREAMS, RAMP_CONNECTIONS_PER_S = 100, 5


def _llmkube_swaps(work: Path, versions: dict[str, str]) -> dict[str, object]:
    """Part 2 in llmkube mode, stamped with its own date and commit (it can run alone)."""
    began = time.monotonic()
    result = swap.run(work / "swap-llmkube", SWAPS, HELD_PER_SWAP, LOAD_DELAY, UNLOAD_DELAY,
                      SWAP_BUDGET, actuation="llmkube")
    facts = machine.facts(versions)
    result["measured"] = {"date": facts["date"], "git_commit": facts["git_commit"],
                          "elapsed_s": round(time.monotonic() - began, 1)}
    return result


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


def _ha(work: Path, versions: dict[str, str]) -> dict[str, object]:
    """Part 5, stamped with its own date and commit (it can run alone)."""
    began = time.monotonic()
    result = ha.run(work / "ha")
    facts = machine.facts(versions)
    result["measured"] = {"date": facts["date"], "git_commit": facts["git_commit"],
                          "elapsed_s": round(time.monotonic() - began, 1)}
    return result


def _stamped(result: dict[str, object], began: float, versions: dict[str, str]
             ) -> dict[str, object]:
    """A part run alone, stamped with its date, commit and duration."""
    facts = machine.facts(versions)
    result["measured"] = {"date": facts["date"], "git_commit": facts["git_commit"],
                          "elapsed_s": round(time.monotonic() - began, 1)}
    return result


def _finish(results: dict, work: Path) -> None:
    report.write(results)
    for target, measured, limit, met in report.targets(results):
        print(f"  {'met   ' if met else 'MISSED'} {target}: {measured} (target {limit})")
    print(f"bench: wrote {report.RESULTS} and {report.DOC}")
    shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """Run everything (or ``--only`` one part) in a scratch directory (kept on failure)."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--only", choices=("swap", "llmkube", "ha", "handoffs", "ablation",
                                           "warm", "peer", "llama", "attacks"),
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
                        "run; "
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
    if only is not None:
        results = json.loads(report.RESULTS.read_text(encoding="utf-8"))
        if only == "peer":
            print("bench: 1b ours beside the Go peer", flush=True)
            results["peer"] = _stamped(peer.run(work / "peer", peer_binary), began, versions)
        elif only == "ablation":
            print("bench: 1c what each part of our Envoy config costs, by its absence",
                  flush=True)
            results["ablation"] = _stamped(ablation.run(work / "ablation"), began, versions)
        elif only == "attacks":
            print("bench: 8 a healthy client beside each attack", flush=True)
            results["attacks"] = _stamped(attacks.run(work / "attacks"), began, versions)
        elif only == "warm":
            print("bench: 7 warm swaps, carry-over and paced release", flush=True)
            results["warm"] = _stamped(warm.run(work / "warm"), began, versions)
        elif only == "handoffs":
            print("bench: 6 hand-offs per request, variants side by side", flush=True)
            results["handoffs"] = _stamped(handoffs.run(work / "handoffs"), began, versions)
        elif only == "swap":
            print("bench: 2/5 swap release latency and overhead, own mode only", flush=True)
            results["swap"] = _stamped(swap.run(work / "swap", SWAPS, HELD_PER_SWAP, LOAD_DELAY,
                                                UNLOAD_DELAY, SWAP_BUDGET), began, versions)
        elif only == "llama":
            print("bench: 2c swaps on real llama.cpp members, both modes", flush=True)
            results["llama"] = _stamped(_llama_swaps(work), began, versions)
        elif only == "llmkube":
            print("bench: 2/5 swap trigger and release latency, llmkube mode only", flush=True)
            results["llmkube"] = _llmkube_swaps(work, versions)
        else:
            print("bench: 5/5 several replicas, 3 beside 1", flush=True)
            results["ha"] = _ha(work, versions)
        _finish(results, work)
        return
    print("bench: 1/5 resident-hit overhead", flush=True)
    results = {"overhead": overhead.run(work / "overhead", WRK_SECONDS, WRK_WARMUP)}
    if peer_binary:
        print("bench: 1b ours beside the Go peer", flush=True)
        part_began = time.monotonic()
        results["peer"] = _stamped(peer.run(work / "peer", peer_binary), part_began, versions)
    print("bench: 2/5 swap release latency, own and llmkube mode", flush=True)
    results["swap"] = swap.run(work / "swap", SWAPS, HELD_PER_SWAP, LOAD_DELAY, UNLOAD_DELAY,
                               SWAP_BUDGET)
    results["llmkube"] = _llmkube_swaps(work, versions)
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
    results["ha"] = _ha(work, versions)
    results["machine"] = machine.facts(versions)
    results["elapsed_s"] = round(time.monotonic() - began, 1)
    if report.RESULTS.exists():
        # parts 6 and 7 run only alone, part 1b only with the peer binary: a run without them
        # keeps their last figures (each stamped with its own date and commit)
        last = json.loads(report.RESULTS.read_text(encoding="utf-8"))
        for part in ("handoffs", "ablation", "warm", "peer", "attacks", "llama"):
            if part not in results and last.get(part) is not None:
                results[part] = last[part]
    _finish(results, work)


if __name__ == "__main__":
    main()
