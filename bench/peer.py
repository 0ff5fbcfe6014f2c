"""Part 1b: ours beside the Go peer, Envoy AI Gateway's ext_proc (``cmd/extproc``).

Runs only when ``MODELPOOL_BENCH_PEER`` names that binary (built from the envoyproxy/ai-gateway
source; it is not on the Go module proxy, see docs/benchmarks.md). The peer does the same job
on a resident hit: reads the OpenAI body, takes ``model`` and sets a routing header
(``x-ai-eg-model``) with a route-cache clear; a route of the peer's Envoy matches that header.

It runs in its *router* role only, in the processing mode it needs: request headers, then the
buffered body (no response phases, no upstream filter; it takes a request that carries
attributes for its upstream filter, so its Envoy sends none). Ours runs twice beside it: in
that same two-message mode, and as shipped (one message, the body alone with its head in
attributes). Each is its own process behind its own Envoy (part 1's config), all in front of
one fake member with a direct Envoy beside them, measured in interleaved, rotated rounds by
part 6's harness (CPU seconds and context switches of every thread, per request), for a small
and a 30 KB body, at c=32 and c=1.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any

import yaml

from devstack import envoyconf
from devstack.procs import LOCALHOST, ManagedProcess, free_port, wait_for_http

from . import envoycfg, handoffs, overhead, services, tools

PEER_ENV = "MODELPOOL_BENCH_PEER"
MEMBER = overhead.MEMBER
#: The model name in tools.BODY, which the peer copies into its routing header.
MODEL = "judge"
OURS_SHIPPED = handoffs.Variant("ours, one message (shipped)")
OURS_TWO = handoffs.Variant("ours, two messages", mode="two")
PEER_NAME = "peer, two messages"


def large_body(size: int = 30_000) -> bytes:
    """A chat request of about ``size`` bytes: ``model`` first, then a long user message."""
    words = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    return (b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"'
            + words.encode() + b'"}],"max_tokens":4}')


class Peer(handoffs.Measured):
    """The peer ext_proc and its Envoy, started (measured as a handoffs.Running is)."""

    name = PEER_NAME

    def __init__(self, workdir: Path, binary: str, members: dict[str, int]) -> None:
        self.dir = workdir / "peer"
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "filter.yaml"
        # Its router role reads no backend: an empty filter config is all it needs.
        config.write_text(f"version: {json.dumps(binary_version(binary, self.dir))}\n",
                          encoding="utf-8")
        port, admin = free_port(), free_port()
        # DISABLE_PPROF: no debug server on its fixed port 6060.
        self.extproc = ManagedProcess(
            [binary, "-configPath", str(config), "-extProcAddr", f"{LOCALHOST}:{port}",
             "-adminPort", str(admin)], self.dir / "extproc.log",
            env={**os.environ, "DISABLE_PPROF": "1"}).start()
        wait_for_http(f"http://{LOCALHOST}:{admin}/health", timeout=30, expect_status=200)
        self.envoy = envoycfg.bench_envoy(self.dir / "envoy", port, members)
        cfg = yaml.safe_load(self.envoy.config_path.read_text(encoding="utf-8"))
        adapt(cfg)
        self.envoy.config_path.write_text(envoyconf.dump(cfg), encoding="utf-8")
        self.envoy.start()
        self.url = f"{self.envoy.url}/v1/chat/completions"
        services.wait_routed(self.url, tools.BODY)



def binary_version(binary: str, workdir: Path) -> str:
    """The version the peer binary requires its filter config to carry: it names it when it
    refuses a config of another version (and exits at once)."""
    probe = workdir / "probe.yaml"
    probe.write_text('version: "?"\n', encoding="utf-8")
    done = subprocess.run([binary, "-configPath", str(probe), "-extProcAddr",
                           f"{LOCALHOST}:{free_port()}", "-adminPort", str(free_port())],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "DISABLE_PPROF": "1"})
    found = re.search(r'version mismatch: expected "([^"]*)"', done.stdout + done.stderr)
    if found is None:
        raise RuntimeError(f"{binary}: no config version in its output: {done.stderr[-300:]}")
    return found.group(1)


def adapt(cfg: dict[str, Any]) -> None:
    """Part 1's Envoy config turned into the peer's: two messages on every route, no request
    attributes (the peer would take the stream for its upstream filter), and a first route
    sending the peer's routing header for our model to the member's cluster."""
    hcm = envoycfg._hcm(cfg)
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    for route in routes:
        route.pop("typed_per_filter_config", None)
    member = envoycfg._named(routes, "member")
    routes.insert(0, {"name": "peer_model", "match": {"prefix": "/", "headers": [
        {"name": "x-ai-eg-model", "string_match": {"exact": MODEL}}]},
        "route": {**{k: v for k, v in member["route"].items() if k != "cluster_header"},
                  "cluster": MEMBER}})
    ext_proc = envoycfg._named(hcm["http_filters"], envoyconf.EXTPROC_FILTER)["typed_config"]
    ext_proc.pop("request_attributes", None)
    ext_proc.pop("metadata_options", None)


def run(workdir: Path, binary: str, rounds: int = 3, seconds: int = 5, warmup: int = 1,
        concurrencies: tuple[int, ...] = (32, 1)) -> dict[str, Any]:
    """Measure direct, ours (both modes) and the peer, interleaved, for both bodies."""
    workdir.mkdir(parents=True, exist_ok=True)
    upstream_port = free_port()
    members = {MEMBER: upstream_port}
    pools = str(overhead.pools_file(workdir))
    started: list[Any] = []
    loads = [os.getloadavg()]
    bodies = {"small": tools.BODY, "30KB": large_body()}
    try:
        started.append(services.start_upstream(workdir, "judge", upstream_port))
        direct = envoycfg.bench_envoy(workdir / "direct", upstream_port, members,
                                      direct_to=MEMBER).start()
        started.append(direct)
        runs: list[Any] = []
        for variant in (OURS_SHIPPED, OURS_TWO):
            runs.append(handoffs.Running(workdir, variant, pools, members))
            started.append(runs[-1])
        runs.append(Peer(workdir, binary, members))
        started.append(runs[-1])
        scripts = {label: tools.wrk_script(workdir, body, f"post-{label}.lua")
                   for label, body in bodies.items()}
        raw = handoffs.interleaved(runs, f"{direct.url}/v1/chat/completions", scripts, rounds,
                                   seconds, warmup, concurrencies)
        loads.append(os.getloadavg())
    finally:
        for proc in reversed(started):
            proc.stop()
    return {"binary": binary, "rounds": rounds, "seconds": seconds, "load_average": loads,
            "body_bytes": {label: len(body) for label, body in bodies.items()},
            "summary": summarize(raw), "raw": raw}


def summarize(raw: list[dict[str, Any]]) -> dict[str, Any]:
    """Per body: part 6's medians, plus ours against the peer (req/s and CPU per request,
    each ratio taken within a round, then the median over rounds)."""
    out: dict[str, Any] = {}
    for body in dict.fromkeys(r["body"] for r in raw):
        mine = [r for r in raw if r["body"] == body]
        summary = handoffs.summarize(mine)
        by = {(r["round"], r["c"], r["variant"]): r for r in mine}
        for c_key, rows in summary.items():
            c = int(c_key[1:])
            for name in (OURS_SHIPPED.name, OURS_TWO.name):
                pairs = [(by[(n, c, name)], by[(n, c, PEER_NAME)]) for n, cc, v in by
                         if cc == c and v == name and (n, c, PEER_NAME) in by]
                if pairs:
                    rows[name]["rps_vs_peer"] = round(statistics.median(
                        a["rps"] / b["rps"] for a, b in pairs), 3)
                    rows[name]["cpu_vs_peer"] = round(statistics.median(
                        a["extproc_cpu_s_per_1k"] / b["extproc_cpu_s_per_1k"]
                        for a, b in pairs), 3)
        out[body] = summary
    return out
