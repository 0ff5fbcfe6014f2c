"""Part 3: thousands of requests held through Envoy for one swap.

Member ``a`` is resident; ``b`` is marked stuck in the simulator (its load never finishes) so the
swap to ``b`` stays open while h2load sends N requests for ``b`` over h2c (many streams per
connection). Once the ext_proc reports N held (or its count stops growing: requests it did not
hold are counted and their fate reported), its memory and CPU are read from /proc; then the
stuck mark is cleared, ``b`` becomes Ready, and every held request is released.

Released requests go to a bare Envoy answering 200 over one h2 connection instead of the
simulator's Python server: the figure is how fast the ext_proc and Envoy let N requests go,
not how fast a single-threaded fake model server accepts N connections.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from . import procstat, tools
from .cluster import NAMESPACE, ClusterStack, body_for
from .stats import ms, percentile

STUCK = "sim.llmkube.dev/stuck"
HELD_METRIC = "llmkube_modelpool_held_requests"


def _wait_held(stack: ClusterStack, n: int, proc: subprocess.Popen[str],
               timeout: float) -> tuple[int, float]:
    """(held, seconds) once the ext_proc holds ``n`` requests or the count stops growing for
    3 s (some were refused at admission); raises if h2load dies or nothing is held in time."""
    began = time.monotonic()
    held, changed = 0, began
    while time.monotonic() - began < timeout:
        now_held = int(stack.extproc.metric(HELD_METRIC))
        if now_held != held:
            held, changed = now_held, time.monotonic()
        if held >= n or (held and time.monotonic() - changed > 3.0):
            return held, changed - began
        if proc.poll() is not None:
            raise RuntimeError(f"h2load exited early:\n{proc.communicate()[0][-2000:]}")
        time.sleep(0.25)
    raise TimeoutError(f"only {held} of {n} held after {timeout}s")


def run_one(workdir: Path, n: int, streams: int, rate: int, idle_s: float = 3.0
            ) -> dict[str, Any]:
    """Hold ``n`` requests for one swap and release them; return the figures."""
    # thousands held for one pool: above the default --max-held, lifted as an operator would
    stack = ClusterStack(workdir, load_delay=0.2, unload_delay=0.1, sink_for="b",
                         extproc_args=("--max-held", "0"))
    body = workdir / "body-b.json"
    h2load: subprocess.Popen[str] | None = None
    try:
        stack.start()
        body.write_bytes(body_for("b"))
        stack.annotate("b", STUCK, "true")
        pid = stack.extproc.pid
        rss_before = procstat.memory_mb(pid)["VmRSS"]
        cpu0 = procstat.cpu_seconds(pid)
        clients = max(1, n // streams)
        args = tools.h2load_args(stack.url, body, n, clients, streams, rate=rate)
        h2load = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        held, admitted_s = _wait_held(stack, n, h2load, timeout=90)
        cpu1 = procstat.cpu_seconds(pid)
        time.sleep(idle_s)
        cpu2 = procstat.cpu_seconds(pid)
        memory = procstat.memory_mb(pid)
        cleared = time.time()
        stack.annotate("b", STUCK, None)
        output = h2load.communicate(timeout=180)[0]
        cpu3 = procstat.cpu_seconds(pid)
        result = tools.parse_h2load(output, " ".join(args))
        time.sleep(0.3)  # Envoy flushes its access log every 100 ms
        assert stack.envoy is not None
        log = [e for e in stack.envoy.access_log()
               if e["upstream_cluster"] == f"b.{NAMESPACE}"]
        ready = next(c["t"] for c in stack.commits() if c["t"] >= cleared
                     and c["kind"] == "inferenceservices" and c["name"] == "b"
                     and c["phase"] == "Ready")
        released = sorted(float(e["start_s"]) + int(e["to_upstream_us"]) / 1e6 - ready
                          for e in log if e["to_upstream_us"] not in ("-", None))
        memory_after = procstat.memory_mb(pid)
    finally:
        if h2load is not None and h2load.poll() is None:
            h2load.kill()
            h2load.communicate()
        stack.stop()
    figures = {
        "n": held, "sent": n, "not_held": n - held, "h2load_connections": clients,
        "connections_per_s": rate, "streams_per_connection": streams,
        "succeeded": result.succeeded, "failed": result.failed, "released": len(released),
        "rss_before_mb": round(rss_before, 1), "rss_mb": round(memory["VmRSS"], 1),
        "rss_peak_mb": round(memory_after["VmHWM"], 1),
        "rss_per_held_kb": round((memory["VmRSS"] - rss_before) * 1024 / max(held, 1), 2),
        "time_to_hold_all_s": round(admitted_s, 2),
        "cpu_admit_s": round(cpu1 - cpu0, 2),
        "cpu_idle_hold_s_per_s": round((cpu2 - cpu1) / idle_s, 3),
        "cpu_release_s": round(cpu3 - cpu2, 2),
        "release_first_ms": ms(released[0]) if released else None,
        "release_p50_ms": ms(percentile(released, 50)),
        "release_all_ms": ms(released[-1]) if released else None,
        "command": result.command,
    }
    print(f"  held: {figures}", flush=True)
    return figures


def run(workdir: Path, sizes: tuple[int, ...], streams: int, rate: int
        ) -> list[dict[str, Any]]:
    """Run the sizes in order; a size that fails is reported with its error."""
    results = []
    for n in sizes:
        try:
            results.append(run_one(workdir / f"n{n}", n, streams, rate))
        except (RuntimeError, TimeoutError, subprocess.TimeoutExpired, StopIteration) as exc:
            print(f"  held n={n} failed: {exc!r}", flush=True)
            results.append({"n": n, "error": repr(exc)[:2000]})
    return results
