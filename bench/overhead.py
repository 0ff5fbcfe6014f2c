"""Part 1: the cost of the ext_proc on a resident hit, against Envoy routing directly.

Three Envoys run side by side in front of one fake member: one without the ext_proc filter
(direct), one with the shipped service, one with the codec baseline (the same service logic on
envoy-data-plane classes). Each is measured with the same wrk POST at 1 and 32 connections,
interleaved so slow drift of a noisy machine hits all three alike.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from devstack.procs import free_port

from . import envoycfg, services, tools

MEMBER = "judge.bench"
VARIANTS = ("direct", "extproc", "baseline")


def pools_file(workdir: Path) -> Path:
    """A static pool whose one member is warmed at start (resident from the first request)."""
    path = workdir / "pools.yaml"
    path.write_text("pools:\n  - namespace: bench\n    name: pool\n    members: [judge]\n"
                    "    default: judge\n", encoding="utf-8")
    return path


def run(workdir: Path, seconds: int, warmup: int, concurrencies: tuple[int, ...] = (1, 32)
        ) -> dict[str, Any]:
    """Measure every variant at every concurrency; return the figures and commands."""
    workdir.mkdir(parents=True, exist_ok=True)
    upstream_port = free_port()
    members = {MEMBER: upstream_port}
    pools = str(pools_file(workdir))
    started: list[Any] = []
    try:
        started.append(services.start_upstream(workdir, "judge", upstream_port))
        extproc = services.ExtProc(workdir, "extproc", services.EXTPROC, "--pools-file", pools)
        baseline = services.ExtProc(workdir, "baseline", services.BASELINE, "--pools-file",
                                    pools)
        for proc in (extproc, baseline):
            started.append(proc.start())
        envoys = {
            "direct": envoycfg.bench_envoy(workdir / "envoy-direct", extproc.port, members,
                                           direct_to=MEMBER),
            "extproc": envoycfg.bench_envoy(workdir / "envoy-extproc", extproc.port, members),
            "baseline": envoycfg.bench_envoy(workdir / "envoy-baseline", baseline.port,
                                             members),
        }
        for envoy in envoys.values():
            started.append(envoy.start())
        url = {name: f"{envoy.url}/v1/chat/completions" for name, envoy in envoys.items()}
        for name in VARIANTS:
            services.wait_routed(url[name], tools.BODY)
        script = tools.wrk_script(workdir)
        results: dict[str, Any] = {}
        for c in concurrencies:
            row: dict[str, Any] = {}
            for name in VARIANTS:
                tools.wrk(url[name], script, c, warmup)
                row[name] = asdict(tools.wrk(url[name], script, c, seconds))
                print(f"  overhead c={c} {name}: {row[name]['rps']:.0f} req/s, "
                      f"p50 {row[name]['p50_ms']:.2f} ms, p99 {row[name]['p99_ms']:.2f} ms, "
                      f"errors {row[name]['errors']}", flush=True)
            results[f"c{c}"] = summarize(row)
        return results
    finally:
        for proc in reversed(started):
            proc.stop()


def summarize(row: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Flatten one concurrency's runs into the result keys, with ratios and differences."""
    out: dict[str, Any] = {}
    for name, r in row.items():
        out[f"{name}_rps"] = round(r["rps"], 1)
        out[f"{name}_p50_ms"] = round(r["p50_ms"], 3)
        out[f"{name}_p99_ms"] = round(r["p99_ms"], 3)
        out[f"{name}_errors"] = r["errors"]
    direct = row["direct"]
    for name in ("extproc", "baseline"):
        out[f"{name}_rps_ratio"] = round(row[name]["rps"] / direct["rps"], 3)
        out[f"{name}_added_p50_ms"] = round(row[name]["p50_ms"] - direct["p50_ms"], 3)
        out[f"{name}_added_p99_ms"] = round(row[name]["p99_ms"] - direct["p99_ms"], 3)
    out["extproc_vs_baseline_rps"] = round(row["extproc"]["rps"] / row["baseline"]["rps"], 2)
    out["commands"] = {name: r["command"] for name, r in row.items()}
    return out
