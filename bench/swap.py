"""Part 2: how fast held requests are released once the target member is Ready.

Swaps alternate between members ``a`` and ``b`` (simulated load and unload delays of a fraction
of a second); each swap is triggered by a few concurrent requests for the non-resident member.
Clocks, all ``CLOCK_REALTIME`` on one host:

- Ready: the emulator's commit of the target's ``status.phase: Ready`` (``bench.apiserver``).
- Reached the member: Envoy's access log, request start plus the time until Envoy began sending
  the request upstream (``US_TX_BEG``): the moment the held request left for the member.

Orchestration overhead per swap = (last request reached the member - first request arrived at
Envoy) - simulated unload delay - simulated load delay. It is split, from the emulator's commit
log, into the ext_proc's reactions and the simulator's own time beyond its configured delays
(which includes starting the member's server process: ``sim_server_start`` is the time from
the pod's creation to its server answering, minus the load delay).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median
from typing import Any

from devstack.simulator_timeline import read_timeline

from . import services
from .cluster import NAMESPACE, ClusterStack, body_for
from .stats import ms, percentile


def _first(commits: list[dict[str, Any]], since: float, **match: Any) -> dict[str, Any] | None:
    for c in commits:
        if c["t"] >= since and all(c.get(k) == v for k, v in match.items()):
            return c
    return None


def _last_before(commits: list[dict[str, Any]], since: float, until: float,
                 name: str) -> dict[str, Any] | None:
    """The incumbent's last commit (pod or member) in the window: what let the swap go on."""
    found = None
    for c in commits:
        if since <= c["t"] <= until and (c["name"] == name or c["labels"].get("app") == name):
            found = c
    return found


def _server_start(timeline: list[dict[str, Any]], member: str, since: float) -> float:
    """Seconds the simulator spent past the load delay to start the member's server process."""
    created = next((e["wall"] for e in timeline if e["member"] == member
                    and e["event"] == "pod_created" and e["wall"] >= since), None)
    started = next((e["wall"] for e in timeline if e["member"] == member
                    and e["event"] == "server_started" and e["wall"] >= since), None)
    return started - created if created and started else float("nan")


def analyse(swaps: list[dict[str, Any]], commits: list[dict[str, Any]],
            log: list[dict[str, Any]], timeline: list[dict[str, Any]], load: float,
            unload: float) -> dict[str, Any]:
    """Turn the swap windows, commit log and access log into latencies and overheads."""
    releases: list[float] = []
    rows: list[dict[str, float]] = []
    for swap in swaps:
        cluster = f"{swap['target']}.{NAMESPACE}"
        reqs = [e for e in log if e["upstream_cluster"] == cluster
                and swap["sent"] - 0.05 <= float(e["start_s"]) <= swap["done"]]
        if len(reqs) < swap["n"]:
            continue
        arrived = [float(e["start_s"]) + int(e["to_upstream_us"]) / 1e6 for e in reqs]
        first_in = min(float(e["start_s"]) for e in reqs)
        ready = _first(commits, first_in, kind="inferenceservices", name=swap["target"],
                       phase="Ready")
        down = _first(commits, first_in, kind="inferenceservices", name=swap["source"],
                      replicas=0)
        up = _first(commits, first_in, kind="inferenceservices", name=swap["target"],
                    replicas=1)
        if not (ready and down and up):
            continue
        gone = _last_before(commits, down["t"], up["t"], swap["source"])
        releases += [a - ready["t"] for a in arrived]
        total = max(arrived) - first_in
        rows.append({
            "total": total,
            "overhead": total - load - unload,
            "extproc_scale_down": down["t"] - first_in,
            "extproc_scale_up": up["t"] - gone["t"] if gone else float("nan"),
            "extproc_release": max(arrived) - ready["t"],
            "sim_unload_extra": (gone["t"] - down["t"] - unload) if gone else float("nan"),
            "sim_load_extra": ready["t"] - up["t"] - load,
            "sim_server_start": _server_start(timeline, swap["target"], first_in) - load,
        })
    return {
        "swaps_measured": len(rows),
        "requests_measured": len(releases),
        "release_p50_ms": ms(percentile(releases, 50)),
        "release_p99_ms": ms(percentile(releases, 99)),
        "release_max_ms": ms(max(releases)) if releases else None,
        "total_p50_ms": ms(median(r["total"] for r in rows)),
        "overhead_ms": ms(median(r["overhead"] for r in rows)),
        "overhead_p99_ms": ms(percentile([r["overhead"] for r in rows], 99)),
        "breakdown_p50_ms": {key: ms(median(r[key] for r in rows)) for key in (
            "extproc_scale_down", "extproc_scale_up", "extproc_release", "sim_unload_extra",
            "sim_load_extra", "sim_server_start")},
        "extproc_overhead_ms": ms(median(r["extproc_scale_down"] + r["extproc_scale_up"]
                                         + r["extproc_release"] for r in rows)),
    }


def run(workdir: Path, swaps: int, held: int, load: float, unload: float,
        budget_s: float) -> dict[str, Any]:
    """Run up to ``swaps`` swaps (stopping at ``budget_s``), then analyse them."""
    stack = ClusterStack(workdir, load, unload)
    windows: list[dict[str, Any]] = []
    failures = 0
    try:
        stack.start()
        resident, deadline = "a", time.monotonic() + budget_s
        with ThreadPoolExecutor(held) as pool:
            for _ in range(swaps):
                if time.monotonic() > deadline:
                    break
                target = "b" if resident == "a" else "a"
                sent = time.time()
                statuses = list(pool.map(lambda _: services.post(stack.url, body_for(target),
                                                                 timeout=30)[0], range(held)))
                failures += sum(1 for s in statuses if s != 200)
                windows.append({"source": resident, "target": target, "sent": sent,
                                "done": time.time(), "n": held})
                resident = target
        time.sleep(0.3)  # Envoy flushes its access log every 100 ms
        assert stack.envoy is not None
        result = analyse(windows, stack.commits(), stack.envoy.access_log(),
                         read_timeline(stack.workdir / "timeline.jsonl"), load, unload)
    finally:
        stack.stop()
    result.update(swaps=len(windows), held_per_swap=held, load_delay_s=load,
                  unload_delay_s=unload, failed_requests=failures)
    print(f"  swap: {result}", flush=True)
    return result
