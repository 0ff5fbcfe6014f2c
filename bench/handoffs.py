"""Part 6: hand-offs per request (context switches and CPU) for each way of running the service.

Each variant is one ext_proc process and one Envoy of its own (both rendered like part 1's),
in front of one fake member, so all of them run side by side and are measured interleaved:
every round runs each variant's wrk once per concurrency, in a rotated order, so a noisy
machine's drift hits them alike. Around each run the ext_proc's and Envoy's CPU time
(``/proc/<pid>/stat``) and context switches (voluntary + involuntary, summed over every
thread in ``/proc/<pid>/task/*/status``: gRPC's poller and event-engine threads switch too)
are read; the figures are per 1,000 requests and per request.

A variant is a processing mode (``two``: headers then body; ``one``: the body alone, as the
shipped standalone Envoy sends a POST with a body), the gRPC server (``native``, the service's
own HTTP/2 on the event loop, or ``grpcio``), a transport from Envoy to the ext_proc (TCP
loopback or a Unix domain socket), the event loop, and changes made through the environment
(``env:NAME=VALUE``, such as ``GRPC_POLL_STRATEGY`` for grpcio) or to the Envoy config
(``envoy:NAME``, one of ``envoycfg.EDITS``).
"""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from devstack import envoyconf
from devstack.procs import LOCALHOST, PROJECT_ROOT, ManagedProcess, free_port, wait_for_http

from . import envoycfg, overhead, procstat, services, tools

MEMBER = overhead.MEMBER


@dataclass(frozen=True)
class Variant:
    """One way of running the service: mode, server, transport, loop, environment."""

    name: str
    mode: str = "one"  # "one" or "two" messages each way
    server: str = "native"  # the service's --grpc-server
    transport: str = "tcp"  # "tcp" or "unix"
    changes: str = ""  # env:NAME=VALUE items
    loop: str = "uvloop"  # the service's --event-loop


VARIANTS = (
    Variant("grpcio, two messages", mode="two", server="grpcio"),
    Variant("grpcio, one message", server="grpcio"),
    Variant("grpcio + unix socket", server="grpcio", transport="unix"),
    Variant("two messages", mode="two"),
    Variant("one message"),
    Variant("one + asyncio loop", loop="asyncio"),
    Variant("one + unix socket", transport="unix"),
)


def switches(pid: int) -> int:
    """Voluntary plus involuntary context switches of every thread of ``pid`` so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status", encoding="ascii") as fh:
                for line in fh:
                    if "ctxt_switches:" in line:
                        total += int(line.split()[1])
        except FileNotFoundError:
            continue  # a thread that ended meanwhile; its switches are gone with it
    return total


class Measured:
    """An ext_proc (``extproc``) behind its Envoy (``envoy``): what a round measures."""

    extproc: ManagedProcess
    envoy: Any

    def pids(self) -> dict[str, int]:
        """The processes measured: the ext_proc and its Envoy."""
        assert self.extproc.pid is not None and self.envoy.process.pid is not None
        return {"extproc": self.extproc.pid, "envoy": self.envoy.process.pid}

    def stop(self) -> None:
        """Stop Envoy, then the ext_proc."""
        self.envoy.stop()
        self.extproc.stop(grace=5)


class Running(Measured):
    """One variant's ext_proc and Envoy, started."""

    def __init__(self, workdir: Path, variant: Variant, pools: str, members: dict[str, int]):
        self.variant = variant
        self.name = variant.name
        slug = "".join(ch if ch.isalnum() else "-" for ch in variant.name)
        self.dir = workdir / slug
        self.dir.mkdir(parents=True, exist_ok=True)
        port, metrics_port = free_port(), free_port()
        listen = f"{LOCALHOST}:{port}"
        self.socket = self.dir / "extproc.sock"
        if variant.transport == "unix":
            listen = f"unix:{self.socket}"
        env = dict(os.environ)
        self.edits: list[str] = []  # envoy:NAME items (envoycfg.EDITS)
        for item in filter(None, variant.changes.split(",")):
            if item.startswith("envoy:"):
                self.edits.append(item[6:])
                continue
            if not item.startswith("env:"):
                raise SystemExit(f"bench: variant {variant.name!r}: unknown change {item!r}")
            key, _, value = item[4:].partition("=")
            env[key] = value
        self.extproc = ManagedProcess(
            [sys.executable, "-m", "extproc", "serve", "--listen", listen,
             "--metrics-listen", f"{LOCALHOST}:{metrics_port}", "--pools-file", pools,
             "--event-loop", variant.loop, "--grpc-server", variant.server],
            self.dir / "extproc.log", env=env, cwd=PROJECT_ROOT).start()
        wait_for_http(f"http://{LOCALHOST}:{metrics_port}/healthz", timeout=30)
        self.envoy = envoycfg.bench_envoy(self.dir / "envoy", port, members)
        cfg = yaml.safe_load(self.envoy.config_path.read_text(encoding="utf-8"))
        self._adapt(cfg)
        self.envoy.config_path.write_text(envoyconf.dump(cfg), encoding="utf-8")
        self.envoy.start()
        self.url = f"{self.envoy.url}/v1/chat/completions"
        services.wait_routed(self.url, tools.BODY)

    def _adapt(self, cfg: dict[str, Any]) -> None:
        if self.variant.mode == "two":
            # The template's two-message default for every route: drop the override.
            hcm = envoycfg._hcm(cfg)
            for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
                route.pop("typed_per_filter_config", None)
        for name in self.edits:
            envoycfg.EDITS[name](cfg)
        if self.variant.transport == "unix":
            cluster = next(c for c in cfg["static_resources"]["clusters"]
                           if c["name"] == envoyconf.EXTPROC_CLUSTER)
            endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
            endpoint["endpoint"]["address"] = {"pipe": {"path": str(self.socket)}}



def _measure(running: Running, script: Path, connections: int, seconds: int) -> dict[str, Any]:
    pids = running.pids()
    before = {k: (procstat.cpu_seconds(p), switches(p)) for k, p in pids.items()}
    result = tools.wrk(running.url, script, connections, seconds)
    after = {k: (procstat.cpu_seconds(p), switches(p)) for k, p in pids.items()}
    n = max(result.requests, 1)
    row: dict[str, Any] = {"rps": result.rps, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms,
                           "requests": result.requests, "errors": result.errors}
    for key in pids:
        row[f"{key}_cpu_s_per_1k"] = (after[key][0] - before[key][0]) * 1000 / n
        row[f"{key}_switches_per_req"] = (after[key][1] - before[key][1]) / n
    return row


def interleaved(runs: list[Any], direct_url: str, scripts: dict[str, Path], rounds: int,
                seconds: int, warmup: int, concurrencies: tuple[int, ...]) -> list[dict[str, Any]]:
    """Every round, for each body (``scripts``: label to wrk script) and concurrency: direct
    once, then each of ``runs`` (anything with ``name``, ``url`` and ``pids()``) in an order
    rotated every round. One raw row per wrk run, labelled with round, body, c and variant."""
    raw: list[dict[str, Any]] = []
    for round_no in range(rounds):
        order = runs[round_no % len(runs):] + runs[:round_no % len(runs)]
        for body, script in scripts.items():
            for c in concurrencies:
                tools.wrk(direct_url, script, c, warmup)
                d = tools.wrk(direct_url, script, c, seconds)
                raw.append({"round": round_no, "body": body, "c": c, "variant": "direct",
                            "rps": d.rps, "p50_ms": d.p50_ms, "p99_ms": d.p99_ms,
                            "requests": d.requests, "errors": d.errors})
                for running in order:
                    tools.wrk(running.url, script, c, warmup)
                    row = _measure(running, script, c, seconds)
                    raw.append({"round": round_no, "body": body, "c": c,
                                "variant": running.name, **row})
                    print(f"  r{round_no} {body} c={c} {running.name}: {row['rps']:.0f} req/s,"
                          f" ext_proc {row['extproc_cpu_s_per_1k']:.3f} CPU s/1k, "
                          f"{row['extproc_switches_per_req']:.1f} switches/req", flush=True)
    return raw


def run(workdir: Path, rounds: int = 3, seconds: int = 5, warmup: int = 1,
        concurrencies: tuple[int, ...] = (32, 1),
        variants: tuple[Variant, ...] = VARIANTS) -> dict[str, Any]:
    """Measure every variant ``rounds`` times at each concurrency; medians and raw rows."""
    workdir.mkdir(parents=True, exist_ok=True)
    upstream_port = free_port()
    members = {MEMBER: upstream_port}
    pools = str(overhead.pools_file(workdir))
    started: list[Any] = []
    loads: list[tuple[float, float, float]] = [os.getloadavg()]
    try:
        started.append(services.start_upstream(workdir, "judge", upstream_port))
        direct = envoycfg.bench_envoy(workdir / "direct", upstream_port, members,
                                      direct_to=MEMBER).start()
        started.append(direct)
        runs = []
        for variant in variants:
            runs.append(Running(workdir, variant, pools, members))
            started.append(runs[-1])
        raw = interleaved(runs, f"{direct.url}/v1/chat/completions",
                          {"small": tools.wrk_script(workdir)}, rounds, seconds, warmup,
                          concurrencies)
        loads.append(os.getloadavg())
    finally:
        for proc in reversed(started):
            proc.stop()
    return {"rounds": rounds, "seconds": seconds, "load_average": loads,
            "variants": [asdict(v) for v in variants], "summary": summarize(raw), "raw": raw}


def summarize(raw: list[dict[str, Any]]) -> dict[str, Any]:
    """Per concurrency and variant: medians over rounds, and req/s against direct and against
    the two-message variant of the same round (the ratio is what survives the noise)."""
    out: dict[str, Any] = {}
    by = {(r["round"], r["c"], r["variant"]): r for r in raw}
    for c in sorted({r["c"] for r in raw}, reverse=True):
        rows: dict[str, Any] = {}
        for name in dict.fromkeys(r["variant"] for r in raw if r["c"] == c):
            mine = [r for r in raw if r["c"] == c and r["variant"] == name]
            summary = {k: round(statistics.median(r[k] for r in mine), 4)
                       for k in mine[0] if k not in ("round", "body", "c", "variant")}
            for base in ("direct", "two messages"):
                ratios = [r["rps"] / by[(r["round"], c, base)]["rps"] for r in mine
                          if (r["round"], c, base) in by]
                if ratios:
                    summary[f"rps_vs_{base.replace(' ', '_')}"] = round(
                        statistics.median(ratios), 3)
            adds = [r["p50_ms"] - by[(r["round"], c, "direct")]["p50_ms"] for r in mine
                    if (r["round"], c, "direct") in by]
            summary["added_p50_ms"] = round(statistics.median(adds), 3) if adds else None
            rows[name] = summary
        out[f"c{c}"] = rows
    return out
