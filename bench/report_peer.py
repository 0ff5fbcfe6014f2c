"""Part 1b's targets and generated section (ours beside the Go peer), for bench/report.py."""

from __future__ import annotations

from typing import Any

from . import peer
from .report_ha import Target, _table

OURS = peer.OURS_SHIPPED.name
VARIANTS = ("direct", OURS, peer.OURS_TWO.name, peer.PEER_NAME)
# The bounds set for the shipped service at c=32 on the small body.
MIN_DIRECT_RATIO, MAX_CPU_S_PER_1K = 0.35, 0.30


def targets(p: dict[str, Any] | None) -> list[Target]:
    """The targets against the peer, when part 1b has been run."""
    if not p:
        return []
    small, large = p["summary"]["small"], p["summary"]["30KB"]
    ours32, ours1 = small["c32"][OURS], small["c1"][OURS]
    peer1 = small["c1"][peer.PEER_NAME]
    return [
        ("c=32 small body: req/s against the peer (same run)", f"{ours32['rps_vs_peer']:.2f}x",
         ">= 1.00x", ours32["rps_vs_peer"] >= 1.0),
        ("c=32 small body: req/s against Envoy direct", f"{ours32['rps_vs_direct']:.2f}",
         f">= {MIN_DIRECT_RATIO}", ours32["rps_vs_direct"] >= MIN_DIRECT_RATIO),
        ("c=32 small body: ext_proc CPU per 1,000 requests",
         f"{ours32['extproc_cpu_s_per_1k']:.3f} s", f"<= {MAX_CPU_S_PER_1K} s",
         ours32["extproc_cpu_s_per_1k"] <= MAX_CPU_S_PER_1K),
        ("c=1 small body: added p50 against the peer's",
         f"{ours1['added_p50_ms']:+.2f} vs {peer1['added_p50_ms']:+.2f} ms", "<= the peer's",
         ours1["added_p50_ms"] <= peer1["added_p50_ms"]),
        ("30 KB body: req/s against the peer, c=32 / c=1",
         f"{large['c32'][OURS]['rps_vs_peer']:.2f}x / {large['c1'][OURS]['rps_vs_peer']:.2f}x",
         ">= 1.00x", all(large[c][OURS]["rps_vs_peer"] >= 1.0 for c in ("c32", "c1"))),
    ]


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None else format(value, fmt)


def section(p: dict[str, Any] | None) -> list[str]:
    """Section 1b (empty when that part has not been run)."""
    if not p:
        return []
    m = p["measured"]
    out = ["", "### 1b. Beside the Go peer (Envoy AI Gateway's ext_proc, same Envoy, same run)",
           "", f"Run {m['date']} at commit `{m['git_commit']}`, {m['elapsed_s']:.0f} s: "
           f"{p['rounds']} interleaved rounds of {p['seconds']} s per wrk run, medians; "
           "ratios taken within a round. Bodies: " + ", ".join(
               f"{label} {size:,} B" for label, size in p["body_bytes"].items()) +
           f"; load average before/after {p['load_average'][0][0]:.1f}/"
           f"{p['load_average'][-1][0]:.1f} (the machine was shared).", ""]
    rows = []
    for body, by_c in p["summary"].items():
        for c_key, by_variant in by_c.items():
            for name in VARIANTS:
                r = by_variant[name]
                rows.append([body, c_key[1:], name, f"{r['rps']:.0f}",
                             f"{r['rps_vs_direct']:.2f}", _cell(r, "rps_vs_peer", ".2f"),
                             f"{r['p50_ms']:.2f}", f"{r['added_p50_ms']:+.2f}",
                             f"{r['p99_ms']:.2f}", _cell(r, "extproc_cpu_s_per_1k", ".3f"),
                             _cell(r, "envoy_cpu_s_per_1k", ".3f"),
                             _cell(r, "extproc_switches_per_req", ".1f")])
    out.append(_table(["body", "conns", "path", "req/s", "vs direct", "vs peer", "p50 ms",
                       "added p50 ms", "p99 ms", "ext_proc CPU s/1k", "Envoy CPU s/1k",
                       "ext_proc switches/req"], rows))
    return out


def ablation_section(a: dict[str, Any] | None) -> list[str]:
    """Section 1c (empty before its first run: ``python -m bench.run --only ablation``)."""
    if not a:
        return []
    m = a["measured"]
    rows = []
    for name, r in a["summary"]["c32"].items():
        if name == "direct":
            continue
        rows.append([name, f"{r['rps']:.0f}", _cell(r, "rps_vs_direct", ".2f"),
                     f"{r['added_p50_ms']:+.2f}", _cell(r, "envoy_cpu_s_per_1k", ".3f"),
                     _cell(r, "extproc_cpu_s_per_1k", ".3f"),
                     _cell(r, "total_cpu_s_per_1k", ".3f")])
    return ["", "### 1c. What each part of our Envoy config costs, by its absence "
            "(`python -m bench.run --only ablation`)", "",
            f"Run {m['date']} at commit `{m['git_commit']}`, {m['elapsed_s']:.0f} s: "
            f"{a['rounds']} interleaved rounds of {a['seconds']} s per wrk run, small body, "
            "c=32, medians; load average before/after "
            f"{a['load_average'][0][0]:.1f}/{a['load_average'][-1][0]:.1f}. Each row takes "
            "one part out of the shipped config (bench/envoycfg.py `EDITS`) and still routes "
            "every request; \"two, bare\" takes out every part that mode can do without.", "",
            _table(["variant", "req/s", "vs direct", "added p50 ms", "Envoy CPU s/1k",
                    "ext_proc CPU s/1k", "total CPU s/1k"], rows)]
