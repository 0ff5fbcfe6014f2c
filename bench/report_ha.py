"""Part 5's targets and generated section (several replicas), for bench/report.py."""

from __future__ import annotations

from typing import Any

Target = tuple[str, str, str, bool]

FOLLOWER_EXTRA_MS = 50.0
# The leader Lease's default duration (15 s, client-go's) plus 3 s: the bound set for it.
KILL_BOUND_S = 15.0 + 3.0


def targets(h: dict[str, Any] | None) -> list[Target]:
    """The replica targets, when part 5 has been run."""
    if not h:
        return []
    out: list[Target] = []
    c1, c32 = h["hits"]["c1"], h["hits"]["c32"]
    out.append(("3 replicas vs 1: resident-hit req/s, c=1 / c=32",
                f"{c1['rps_3_vs_1']:.2f}x / {c32['rps_3_vs_1']:.2f}x (noise "
                f"{c1['noise_rps']:.0%} / {c32['noise_rps']:.0%})", "no worse than 1 replica",
                all(c["rps_3_vs_1"] >= 1 - c["noise_rps"] for c in (c1, c32))))
    out.append(("3 replicas vs 1: added p50, c=1 / c=32",
                f"{c1['added_p50_3_minus_1_ms']:+.2f} / {c32['added_p50_3_minus_1_ms']:+.2f} ms "
                f"(noise {c1['noise_p50_ms']:.2f} / {c32['noise_p50_ms']:.2f} ms)",
                "no worse than 1 replica",
                all(c["added_p50_3_minus_1_ms"] <= c["noise_p50_ms"] for c in (c1, c32))))
    if "rps_3p_vs_1" in c32:  # runs before the preferred variant lack it
        out.append(("3 replicas, Envoy preferring one (two stand by) vs 1: req/s, c=1 / c=32",
                    f"{c1['rps_3p_vs_1']:.2f}x / {c32['rps_3p_vs_1']:.2f}x (noise "
                    f"{c1['noise_rps']:.0%} / {c32['noise_rps']:.0%})", ">= 1.00x",
                    all(c["rps_3p_vs_1"] >= 1 - c["noise_rps"] for c in (c1, c32))))
        total = {n: c32[f"{n}_extproc_cpu_s_per_1k"] + c32[f"{n}_envoy_cpu_s_per_1k"]
                 for n in ("replicas1", "replicas3p", "replicas3")}
        out.append(("Envoy + ext_proc CPU s per 1,000 hits, c=32: 1 / 3 preferring one / "
                    "3 round robin", " / ".join(f"{total[n]:.3f}" for n in total),
                    "3 preferring one <= 1 replica (+ noise)",
                    total["replicas3p"] <= total["replicas1"] * (1 + c32["noise_rps"])))
    extra = h["swap"]["follower_minus_leader_p50_ms"]
    out.append(("swap via a follower vs via the leader, request to served p50",
                f"{extra:+.1f} ms", f"<= +{FOLLOWER_EXTRA_MS:.0f} ms",
                extra <= FOLLOWER_EXTRA_MS))
    k = h["leader_kill"]
    worst = k["kill_to_served_max_s"]
    out.append((f"leader SIGKILL mid-swap to swap completed (slowest of {k['trials']})",
                f"{worst:.1f} s" if worst is not None else "not completed",
                f"<= {KILL_BOUND_S:.0f} s (lease 15 s + 3 s)",
                worst is not None and worst <= KILL_BOUND_S
                and k["held_served"] == k["held_sent"]))
    return out


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def section(h: dict[str, Any] | None) -> list[str]:
    """Section 5 (empty when part 5 has not been run)."""
    if not h:
        return []
    m = h["measured"]
    out = ["", "### 5. Several replicas: 3 replicas side by side with 1", "",
           f"Run {m['date']} at commit `{m['git_commit']}`, {m['elapsed_s']:.0f} s. Both stacks "
           f"ran at once; the replicas' extra flags: `{' '.join(h['extproc_args'])}`.", "",
           "**Resident hits** (wrk, 1 thread; means of "
           f"{h['hits']['c1']['rounds']} interleaved rounds):", ""]
    rows = []
    for c in ("c1", "c32"):
        row = h["hits"][c]
        for name, label in (("direct", "direct"), ("replicas1", "1 replica"),
                            ("replicas3", "3 replicas, round robin"),
                            ("replicas3p", "3 replicas, one preferred")):
            if f"{name}_rps" not in row:
                continue
            added = row.get(f"{name}_added_p50_ms")
            cpu = [row.get(f"{name}_{k}_cpu_s_per_1k") for k in ("extproc", "envoy")]
            rows.append([c[1:], label, f"{row[f'{name}_rps']:.0f}", f"{row[f'{name}_p50_ms']:.2f}",
                         "-" if added is None else f"{added:+.2f}",
                         f"{row[f'{name}_p99_ms']:.2f}", row[f"{name}_errors"],
                         *("-" if v is None else f"{v:.3f}" for v in cpu)])
    out.append(_table(["conns", "path", "req/s", "p50 ms", "added p50 ms", "p99 ms", "errors",
                       "ext_proc CPU s/1k (all replicas)", "Envoy CPU s/1k"], rows))
    s = h["swap"]
    out += ["", f"**Swaps** a <-> b (load {h['load_delay_s']} s, unload {h['unload_delay_s']} s), "
            "each by 3 concurrent requests sent through an Envoy whose ext_proc is one chosen "
            "replica; time from sending a request to its 200, client side:", ""]
    rows = []
    for path, label in (("replicas1", "1 replica"), ("leader", "3 replicas, via the leader"),
                        ("follower", "3 replicas, via a follower")):
        p = s[path]
        b = p["breakdown_p50_ms"]
        stages = [f"{b[k]} ms" if k in b else "-" for k in ("decide", "drain", "unload",
                                                            "load_and_release")]
        rows.append([label, p["swaps"], p["requests"], f"{p['served_p50_ms']} ms",
                     f"{p['served_p90_ms']} ms", f"{p['served_max_ms']} ms",
                     f"{p['swap_p50_ms']} ms", *stages, p["failed_requests"]])
    out.append(_table(["path", "swaps", "requests", "served p50", "served p90", "served max",
                       "swap (last served) p50", "decide p50", "drain p50", "unload p50",
                       "load + release p50", "failed"], rows))
    out += ["", "Stages, from the leading replica's log (millisecond timestamps): requests sent "
            "→ `SwapStarted` (decide) → incumbent scaled to 0 (drain) → target scaled to 1 "
            "(unload) → last request served (load and release)."]
    out += ["", f"Follower minus leader: {s['follower_minus_leader_p50_ms']:+.1f} ms (p50 per "
            f"request), {s['follower_minus_leader_swap_p50_ms']:+.1f} ms (p50 per swap); "
            f"swaps during which the leader Lease changed hands: {s['leader_moved_during']}."]
    k = h["leader_kill"]
    out += ["", "**Leader SIGKILL mid-swap** (a streamed request on the incumbent through one "
            "follower, 3 requests for the other member through the other follower; SIGKILL once "
            "the status names the target pending). Seconds from the kill:", ""]
    rows = [[i + 1, r.get("killed"), "yes" if r.get("incumbent_up_at_kill") else "no",
             r.get("new_leader"), r.get("kill_to_new_leader_s"), r.get("new_leader_to_served_s"),
             r.get("kill_to_served_s"), r.get("kill_to_resident_s"),
             f"{r.get('held_served')}/{r.get('held')}", r.get("idle_probes_of_incumbent"),
             r.get("error", "")] for i, r in enumerate(k["runs"])]
    out.append(_table(["trial", "killed", "incumbent up at kill", "new leader",
                       "kill → new leader holds the Lease (s)", "then → served (s)",
                       "kill → last held served (s)", "kill → status resident (s)",
                       "held served by their member", "idle probes of the incumbent",
                       "error"], rows))
    out += ["", "**API writes per replica per second** (each replica's "
            "`modelpool_extproc_kube_requests_total`, create/update/patch/delete; the "
            "emulator's record of the service's writes, all replicas together, beside it):", ""]
    rows = []
    for when, label in (("rest", "at rest"), ("hits", "resident hits, c=32"),
                        ("swaps", "swaps")):
        for n in ("replicas1", "replicas3"):
            w = h["api_writes"][when].get(n)
            if not w:
                continue
            swaps = w.get("swaps")
            per_swap = f"{w['total_per_s'] * w['seconds'] / swaps:.1f}" if swaps else "-"
            rows.append([label, n[-1], f"{w['seconds']} s", _rate(w["leader_per_s"]),
                         _rate(w["follower_per_s_max"]), _rate(w["total_per_s"]),
                         _rate(w["emulator_total_per_s"]), per_swap,
                         "; ".join(f"{name} ({r['role']}): " + ", ".join(
                             f"{kind} {count}" for kind, count in r["writes"].items())
                             for name, r in w["per_replica"].items())])
    out.append(_table(["when", "replicas", "window", "leader /s", "follower /s (max)",
                       "all replicas /s", "emulator /s", "writes per swap", "writes by kind"],
                      rows))
    return out


def commands(h: dict[str, Any] | None) -> list[str]:
    """Part 5's wrk command lines (first round)."""
    if not h:
        return []
    return [cmd for c in ("c1", "c32") for cmd in h["hits"][c]["commands"].values()]
