"""The Markdown of part 7 (warm swaps: prompt-cache carry-over and paced release) and part 2c
(swaps on real llama.cpp members)."""

from __future__ import annotations

from typing import Any


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def section(w: dict[str, Any] | None) -> list[str]:
    """Part 7's lines ([] before its first run: ``python -m bench.run --only warm``)."""
    if not w:
        return []
    c = w["carry_over"]
    m = w.get("measured", {})
    return ["", "### 7. Warm swaps (`python -m bench.run --only warm`)", "",
            f"Run of {m.get('date', '?')} at commit `{m.get('git_commit', '?')}`, "
            f"{m.get('elapsed_s', '?')} s, alone (the machine was shared with other work). "
            f"Simulated prefill: {c['prefill_ms_per_token']} ms per prompt token the slot's "
            "cache lacks; member load 0.2 s, unload 0.1 s.", "", *_warm_tables(w)]


def _warm_tables(w: dict[str, Any]) -> list[str]:
    c, p = w["carry_over"], w["paced_release"]
    out = [f"Prompt-cache carry-over, a {c['prompt_tokens']}-token conversation that comes "
           f"back after a -> b -> a (median of {c['rounds']} rounds):", ""]
    rows = [[name, c[key]["cold_ttft_s"], c[key]["swap_away_ttft_s"],
             c[key]["return_ttft_s"], c[key]["return_cache_n"], c[key]["return_prompt_ms"]]
            for name, key in (("carry-over on", "with"), ("off", "without"))]
    out += _table(["", "first turn TTFT s (cold)", "a -> b TTFT s (swap, save incl.)",
                   "returning turn TTFT s (swap b -> a, restore, prefill)",
                   "its cache_n", "its prompt_ms"], rows)
    out += ["", f"Paced release: {p['requests']} streamed requests held for a member with "
            f"{p['slots']} slots ({p['prompt_tokens']}-token prompts), released all at once "
            "vs up to its capacity (two swaps each):", ""]
    out += _table(["release", "ok", "failed", "TTFT p50 s", "TTFT p99 s", "TTFT max s"],
                  [[name, p[key]["ok"], p[key]["failed"], p[key]["p50_ttft_s"],
                    p[key]["p99_ttft_s"], p[key]["max_ttft_s"]]
                   for name, key in (("all at once", "all_at_once"), ("paced", "paced"))])
    return out


def llama_section(r: dict[str, Any] | None) -> list[str]:
    """Part 2c's lines ([] before its first run: ``python -m bench.run --only llama``)."""
    if not r:
        return []
    m = r.get("measured", {})
    out = ["", "### 2c. Swaps on real llama.cpp members (`python -m bench.run --only llama`)", "",
           f"Run of {m.get('date', '?')} at commit `{m.get('git_commit', '?')}`, "
           f"{m.get('elapsed_s', '?')} s. No simulated delays: each load starts llama.cpp's "
           "own `llama-server` on the generated tiny model and waits for its `/health`, each "
           "unload is its SIGTERM and exit, so `sim_*` below is the real server's own time and "
           "the rest is ours.", ""]
    rows = []
    for mode in ("own", "llmkube"):
        s = r.get(mode) or {}
        if not s.get("swaps_measured"):
            continue
        breakdown = ", ".join(f"{k} {v} ms" for k, v in s["breakdown_p50_ms"].items())
        ours = s.get("extproc_overhead_ms", s["breakdown_p50_ms"].get("extproc_release"))
        rows.append([mode, s["swaps_measured"], s["requests_measured"], f"{s['total_p50_ms']} ms",
                     f"{ours} ms", f"{s['release_p50_ms']} ms", s["failed_requests"], breakdown])
    out += _table(["mode", "swaps", "held requests", "swap total p50",
                   "ours p50 (own: scale calls + release; llmkube: release)", "release p50",
                   "failed", "breakdown p50"], rows)
    out += ["", "In llmkube mode the simulator also plays the Deployment's rollout (the pod "
            "appears 0.5 s after the scale-up, as LLMKube's controller makes it), which "
            "`sim_load_extra` includes."]
    if r.get("warm"):
        out += ["", "Part 7's warm swaps on the same real servers: the conversation on the "
                "generated `large` model (24 layers, 1024 wide: its prefill takes seconds on "
                "one thread) in one 512-token slot, its slot saved to and restored from "
                "llama.cpp's own slot files; the herd on the `tiny` model at `-np` "
                f"{r['warm']['paced_release']['slots']}. The TTFTs and `cache_n` are the "
                "real server's. With carry-over on, the a -> b turn is quicker too: from the "
                "second round on, b's own slot (the same short question) is restored, so it "
                "prefills almost nothing (the large model takes ~25 ms per prompt token).", "",
                *_warm_tables(r["warm"])]
    return out


def _fresh(row: dict[str, Any]) -> str:
    """A row's fresh connections: ok of all tried ("-" for a row measured without them)."""
    if "fresh_ok" not in row:
        return "-"
    return f"{row['fresh_ok']} of {row['fresh_ok'] + row['fresh_failed']}"


def attacks_section(r: dict[str, Any] | None) -> list[str]:
    """Part 8's lines ([] before its first run: ``python -m bench.run --only attacks``)."""
    if not r:
        return []
    m = r.get("measured", {})
    dates = sorted({row.get("date", m.get("date", "?")) for row in r["rows"]})
    when = (f"Run of {m.get('date', '?')}" if len(dates) == 1 else
            f"Rows measured on {', '.join(dates)} (each row's date in its last column); the "
            f"last run of {m.get('date', '?')}")
    out = ["", "### 8. A healthy client beside each attack (`python -m bench.run --only attacks`)",
           "", f"{when} at commit `{m.get('git_commit', '?')}`. Each attack "
           f"(devstack/h2attacks.py) runs {r['seconds']:g} s from a process of its own against "
           f"`serve`; a gRPC health check every {r['probe_every_ms']} ms beside it. CPU is the "
           "server's over the attack; memory its RSS before, at the peak, and 1 s after (12 s "
           "after 50,000 streams over 100 connections). Every half second a check on a "
           "connection of its own (a reconnecting Envoy): how many got in (a row measured "
           "before that probe existed shows -).", ""]
    rows = [[row["attack"], row["probes"], row["lost"], row["p50_ms"], row["p99_ms"],
             row["max_ms"], _fresh(row), row["server_cpu_s"],
             f"{row['rss_before_mb']} / {row['rss_peak_mb']} / {row['rss_after_mb']}",
             *([row.get("date", m.get("date", "?"))] if len(dates) > 1 else [])]
            for row in r["rows"]]
    head = ["attack", "probes", "lost", "p50 ms", "p99 ms", "max ms", "fresh connections ok",
            "server CPU s", "RSS before / peak / after MB", *(["measured"] if len(dates) > 1
                                                              else [])]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out
