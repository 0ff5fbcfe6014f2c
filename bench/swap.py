"""Part 2: how fast held requests are released once the target member can serve, per actuation.

Swaps alternate between members ``a`` and ``b`` (simulated load and unload delays of a fraction
of a second); each swap is triggered by a few concurrent requests for the non-resident member.
The same loop runs in both actuation modes (``own``: the service drains, unloads, loads;
``llmkube``: the service only triggers, LLMKube's reconciler stand-in does the rest). Clocks,
all ``CLOCK_REALTIME`` on one host:

- Commits: the emulator's log of every InferenceService, Pod and ModelPool write, with the API
  user who made it (``bench.apiserver``): Ready is the commit of the target's
  ``status.phase: Ready``; in llmkube mode, the trigger is the service's (user
  ``modelpool-extproc``) ``spec.replicas: 1`` commit of the target and "resident" the commit
  of ``status.residentMember`` naming it.
- Reached the member: Envoy's access log, request start plus the time until Envoy began sending
  the request upstream (``US_TX_BEG``): the moment the held request left for the member.

Own mode: release is measured from Ready. Orchestration overhead per swap = (last request
reached the member - first request arrived at Envoy) - simulated unload delay - simulated load
delay. It is split, from the commit log, into the ext_proc's reactions and the simulator's own
time beyond its configured delays (which includes starting the member's server process:
``sim_server_start`` is the time from the pod's creation to its server answering, minus the
load delay).

llmkube mode: release is measured from the later of Ready and resident (the service may only
release then), trigger from the first request's arrival at Envoy; the swap is split into the
service's trigger, the reconciler's scale-down (after its idle probe) and scale-up (after it
sees the incumbent's pods gone: it does not watch pods), its status write after Ready, and the
service's release.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median
from typing import Any

from devstack.simulator_timeline import read_timeline

from . import services
from .cluster import EXTPROC_USER, NAMESPACE, RECONCILER_USER, ClusterStack, body_for
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


def _held_arrivals(swap: dict[str, Any],
                   log: list[dict[str, Any]]) -> tuple[float, list[float]] | None:
    """(first request in at Envoy, when each left for the member); None if any is missing."""
    cluster = f"{swap['target']}.{NAMESPACE}"
    reqs = [e for e in log if e["upstream_cluster"] == cluster
            and swap["sent"] - 0.05 <= float(e["start_s"]) <= swap["done"]]
    if len(reqs) < swap["n"]:
        return None
    arrived = [float(e["start_s"]) + int(e["to_upstream_us"]) / 1e6 for e in reqs]
    return min(float(e["start_s"]) for e in reqs), arrived


def _own_swap(swap: dict[str, Any], commits: list[dict[str, Any]], first_in: float,
              arrived: list[float], timeline: list[dict[str, Any]], load: float,
              unload: float) -> tuple[float, dict[str, float]] | None:
    """(released-from time, row) of one own-mode swap; None when a commit is missing."""
    ready = _first(commits, first_in, kind="inferenceservices", name=swap["target"],
                   phase="Ready")
    down = _first(commits, first_in, kind="inferenceservices", name=swap["source"], replicas=0)
    up = _first(commits, first_in, kind="inferenceservices", name=swap["target"], replicas=1)
    if not (ready and down and up):
        return None
    gone = _last_before(commits, down["t"], up["t"], swap["source"])
    total = max(arrived) - first_in
    return ready["t"], {
        "total": total,
        "overhead": total - load - unload,
        "extproc_scale_down": down["t"] - first_in,
        "extproc_scale_up": up["t"] - gone["t"] if gone else float("nan"),
        "extproc_release": max(arrived) - ready["t"],
        "sim_unload_extra": (gone["t"] - down["t"] - unload) if gone else float("nan"),
        "sim_load_extra": ready["t"] - up["t"] - load,
        "sim_server_start": _server_start(timeline, swap["target"], first_in) - load,
    }


def _llmkube_swap(swap: dict[str, Any], commits: list[dict[str, Any]], first_in: float,
                  arrived: list[float], timeline: list[dict[str, Any]], load: float,
                  unload: float) -> tuple[float, dict[str, float]] | None:
    """(released-from time, row) of one llmkube-mode swap; None when a commit is missing."""
    source, target = swap["source"], swap["target"]
    trigger = _first(commits, first_in, kind="inferenceservices", name=target, replicas=1,
                     user=EXTPROC_USER)
    if not trigger:
        return None
    after = trigger["t"]
    ready = _first(commits, after, kind="inferenceservices", name=target, phase="Ready")
    resident = _first(commits, after, kind="modelpools", resident=target)
    down = _first(commits, after, kind="inferenceservices", name=source, replicas=0,
                  user=RECONCILER_USER)
    up = _first(commits, after, kind="inferenceservices", name=target, replicas=1,
                user=RECONCILER_USER)
    if not (ready and resident and down and up):
        return None
    gone = _last_before(commits, down["t"], up["t"], source)
    can_serve = max(ready["t"], resident["t"])
    return can_serve, {
        "total": max(arrived) - first_in,
        "trigger": after - first_in,
        "ready_wait": ready["t"] - after,  # the sum of the five steps below
        "llmkube_scale_down": down["t"] - after,
        "sim_unload_extra": (gone["t"] - down["t"] - unload) if gone else float("nan"),
        "llmkube_scale_up": up["t"] - gone["t"] if gone else float("nan"),
        "sim_load_extra": ready["t"] - up["t"] - load,
        "llmkube_resident_after_ready": resident["t"] - ready["t"],
        "extproc_release": max(arrived) - can_serve,
        "last_release_from_ready": max(arrived) - ready["t"],
    }


_SWAP_OF = {"own": _own_swap, "llmkube": _llmkube_swap}


def _summary(rows: list[dict[str, float]], keys: tuple[str, ...]) -> dict[str, float]:
    return {key: ms(median(r[key] for r in rows)) for key in keys}


def analyse(swaps: list[dict[str, Any]], commits: list[dict[str, Any]],
            log: list[dict[str, Any]], timeline: list[dict[str, Any]], load: float,
            unload: float, actuation: str = "own") -> dict[str, Any]:
    """Turn the swap windows, commit log and access log into latencies and overheads."""
    releases: list[float] = []
    rows: list[dict[str, float]] = []
    for swap in swaps:
        held = _held_arrivals(swap, log)
        measured = held and _SWAP_OF[actuation](swap, commits, *held, timeline, load, unload)
        if not measured:
            continue
        can_serve, row = measured
        releases += [a - can_serve for a in held[1]]
        rows.append(row)
    result: dict[str, Any] = {
        "swaps_measured": len(rows),
        "requests_measured": len(releases),
        "release_p50_ms": ms(percentile(releases, 50)),
        "release_p99_ms": ms(percentile(releases, 99)),
        "release_max_ms": ms(max(releases)) if releases else None,
        "total_p50_ms": ms(median(r["total"] for r in rows)) if rows else None,
    }
    if not rows:
        return result
    if actuation == "llmkube":
        triggers = [r["trigger"] for r in rows]
        return {**result, "trigger_p50_ms": ms(percentile(triggers, 50)),
                "trigger_p99_ms": ms(percentile(triggers, 99)),
                "last_release_from_ready_p99_ms": ms(percentile(
                    [r["last_release_from_ready"] for r in rows], 99)),
                "resident_after_ready_p99_ms": ms(percentile(
                    [r["llmkube_resident_after_ready"] for r in rows], 99)),
                "breakdown_p50_ms": _summary(rows, (
                    "trigger", "ready_wait", "llmkube_scale_down", "sim_unload_extra",
                    "llmkube_scale_up", "sim_load_extra", "llmkube_resident_after_ready",
                    "extproc_release"))}
    return {
        **result,
        "overhead_ms": ms(median(r["overhead"] for r in rows)),
        "overhead_p99_ms": ms(percentile([r["overhead"] for r in rows], 99)),
        "breakdown_p50_ms": _summary(rows, (
            "extproc_scale_down", "extproc_scale_up", "extproc_release", "sim_unload_extra",
            "sim_load_extra", "sim_server_start")),
        "extproc_overhead_ms": ms(median(r["extproc_scale_down"] + r["extproc_scale_up"]
                                         + r["extproc_release"] for r in rows)),
    }


def service_writes(record: list[dict[str, Any]]) -> dict[str, int]:
    """The service's writes by kind, from its request record; replica patches other than a
    0 -> 1 trigger are counted apart (llmkube mode must make none)."""
    counts: dict[str, int] = {}
    for entry in record:
        if entry["verb"] in ("get", "list", "watch"):
            continue
        kind = f"{entry['verb']} {entry['resource']}" + (
            f"/{entry['subresource']}" if entry.get("subresource") else "")
        if entry["resource"] == "inferenceservices" and entry["verb"] == "patch":
            trigger = (entry.get("body") or {}).get("spec") == {"replicas": 1}
            kind += " (trigger 0 -> 1)" if trigger else " (not a trigger)"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def run(workdir: Path, swaps: int, held: int, load: float, unload: float,
        budget_s: float, actuation: str = "own", runtime: str = "fake") -> dict[str, Any]:
    """Run up to ``swaps`` swaps (stopping at ``budget_s``) in one actuation mode, then
    analyse them. With ``runtime="llama.cpp"`` (and no delays) the simulator's load and unload
    are llama.cpp's own server starting, loading and stopping: ``sim_*`` is their time."""
    stack = ClusterStack(workdir, load, unload, actuation=actuation, runtime=runtime)
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
                         read_timeline(stack.workdir / "timeline.jsonl"), load, unload,
                         actuation)
        if actuation == "llmkube":
            result["service_writes"] = service_writes(stack.api_requests(EXTPROC_USER))
    finally:
        stack.stop()
    result.update(actuation=actuation, runtime=runtime, swaps=len(windows), held_per_swap=held,
                  load_delay_s=load, unload_delay_s=unload, failed_requests=failures)
    print(f"  swap ({actuation}, {runtime}): {result}", flush=True)
    return result
