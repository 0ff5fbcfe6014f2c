"""Part 5: several replicas, 3 replicas side by side with 1 in the same run.

Two local stacks run at once (``bench.ha_stacks``): 1 replica and 3 replicas, each with its own
API emulator, simulator and members (load 0.2 s, unload 0.1 s, as part 2), all defaults of the
service except ``--idle-probe-url`` (the loopback probe router) and ``--lost-replica-wait``.

1. **Resident hits.** wrk (one thread, part 1's POST, 2 s warm-up then 6 s) at 1 and 32
   connections against the direct Envoy, the 1-replica stack's Envoy and the 3-replica stack's
   Envoy (round-robin over its replicas), interleaved, two rounds; figures are the rounds'
   means. Added p50 = p50 - direct p50. The noise is how far the two rounds of one path fell
   apart (the larger of the two stacks'): "no worse than 1 replica" is judged within it.
2. **A swap through the leader vs through a follower.** On the 3-replica stack, swaps a <-> b,
   each triggered by 3 concurrent requests sent to the Envoy whose ext_proc cluster is one
   chosen replica alone: the pool's leader (its leader Lease's holder, read before each swap)
   or a follower (the two alternate). Time from request to served: the client's, from sending
   each request to its 200. Paths in the order leader, follower, follower, leader, so both see
   both directions; a pause after each swap keeps the drain linger out of both. The same swaps
   on the 1-replica stack give the single-replica figure.
3. **Leader SIGKILL mid-swap.** With ``a`` resident: a streamed request for ``a`` (~3 s) through
   one follower keeps the incumbent busy, 3 requests for ``b`` through the other follower start
   a swap; once the status names ``b`` pending (the leader is draining: ``a`` still up) the
   leader gets SIGKILL. Measured from the kill: another replica holds the leader Lease, the
   held requests are served, the status names ``b`` resident. The new leader may unload ``a``
   only once the killed replica's unknown in-flight is settled: by the idle probe (through the
   router: the count of probes it answered is reported) or ``--lost-replica-wait``.
4. **API writes per replica.** Each replica's own ``modelpool_extproc_kube_requests_total``
   (create/update/patch/delete), read before and after a window, per second: at rest (no
   traffic), during the c=32 resident hits, during the swaps of 2. The emulator's request
   record (reset at the window's start) counts the same writes for the whole stack (the
   replicas share one API user, so it cannot split them).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any, Callable

from devstack.stack_swaps import read_log

from . import procstat, services, tools
from .ha_stacks import HaBench, HaStack, chat
from .stats import ms, percentile

WRK_SECONDS, WRK_WARMUP, ROUNDS = 6, 2, 3
LOAD_DELAY, UNLOAD_DELAY = 0.2, 0.1
SWAPS_PER_PATH, HELD = 10, 3
SWAP_PAUSE = 0.6  # s after each swap: past the drain linger's 0.5 s cap
REST_SECONDS = 20
KILL_TRIALS = 3
STREAM_TOKENS = 150  # the fake member streams a token every 20 ms: ~3 s
PATHS = ("leader", "follower", "follower", "leader")
VARIANTS = ("direct", "replicas1", "replicas3", "replicas3p")


def _wait(check: Callable[[], Any], timeout: float, interval: float = 0.05) -> float | None:
    """Poll ``check`` until truthy; the monotonic time it first was, None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(interval)
    return None


class WriteWindow:
    """API writes of one stack's replicas between ``open()`` and ``close()``."""

    def __init__(self, ha: HaStack) -> None:
        self.ha = ha
        self.before: dict[str, dict[str, float]] = {}
        self.began = 0.0

    def open(self) -> WriteWindow:
        self.before = self.ha.write_counts()
        self.ha.reset_api_record()
        self.began = time.monotonic()
        return self

    def close(self) -> dict[str, Any]:
        seconds = time.monotonic() - self.began
        after = self.ha.write_counts()
        recorded = self.ha.recorded_writes()
        boss = self.ha.leader()
        replicas: dict[str, Any] = {}
        for name, counts in after.items():
            was = self.before.get(name, {})
            delta = {k: int(v - was.get(k, 0)) for k, v in counts.items() if v - was.get(k, 0)}
            replicas[name] = {"role": "leader" if name == boss else "follower",
                              "writes_per_s": round(sum(delta.values()) / seconds, 2),
                              "writes": delta}
        rates = [(r["role"], r["writes_per_s"]) for r in replicas.values()]
        followers = [rate for role, rate in rates if role == "follower"]
        return {"seconds": round(seconds, 1), "per_replica": replicas,
                "leader_per_s": next((rate for role, rate in rates if role == "leader"), None),
                "follower_per_s_max": max(followers) if followers else None,
                "total_per_s": round(sum(rate for _, rate in rates), 2),
                "emulator_total_per_s": round(recorded / seconds, 2)}


def at_rest(bench: HaBench, seconds: float) -> dict[str, Any]:
    """Both stacks idle with ``a`` resident: writes per replica per second."""
    windows = {n: WriteWindow(ha).open() for n, ha in bench.stacks.items()}
    time.sleep(seconds)
    return {f"replicas{n}": w.close() for n, w in windows.items()}


def hits(bench: HaBench, workdir: Path, writes: dict[str, Any]) -> dict[str, Any]:
    """wrk at c=1 and c=32 on direct, 1 replica, 3 replicas, interleaved, ROUNDS rounds; the
    API writes of each stack during its first c=32 run."""
    url = {"direct": bench.direct_url, "replicas1": bench.stacks[1].url(),
           "replicas3": bench.stacks[3].url(), "replicas3p": bench.stacks[3].preferred_url}
    script = tools.wrk_script(workdir, chat("a"))
    results: dict[str, Any] = {}
    for c in (1, 32):
        row: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
        for round_ in range(ROUNDS):
            for name in VARIANTS:
                tools.wrk(url[name], script, c, WRK_WARMUP)
                window = WriteWindow(bench.stacks[_replicas(name)]).open() \
                    if c == 32 and name in ("replicas1", "replicas3") and round_ == 0 else None
                pids = _pids(bench, name)
                before = {k: sum(procstat.cpu_seconds(p) for p in ps) for k, ps in pids.items()}
                r = asdict(tools.wrk(url[name], script, c, WRK_SECONDS))
                for k, ps in pids.items():
                    used = sum(procstat.cpu_seconds(p) for p in ps) - before[k]
                    r[f"{k}_cpu_s_per_1k"] = 1000 * used / max(1, r["requests"])
                row[name].append(r)
                if window:
                    writes[name] = window.close()
                print(f"  ha hits c={c} {name}: {r['rps']:.0f} req/s, p50 {r['p50_ms']:.2f} ms, "
                      f"errors {r['errors']}", flush=True)
        results[f"c{c}"] = _hits_summary(row)
    return results


def _pids(bench: HaBench, name: str) -> dict[str, list[int]]:
    """The processes whose CPU a stack's hits cost: its replicas together, and its Envoy."""
    if name == "direct":
        return {}
    ha = bench.stacks[_replicas(name)]
    envoy = ha.preferred if name == "replicas3p" else ha.envoy
    assert envoy is not None and envoy.process.pid is not None
    return {"extproc": [r.pid for r in ha.stack.replicas if r.pid is not None],
            "envoy": [envoy.process.pid]}


def _replicas(name: str) -> int:
    """The stack a variant's hits go to: "replicas3p" is the 3-replica stack, one preferred."""
    return int(name.removeprefix("replicas").removesuffix("p"))


def _hits_summary(row: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Means over the rounds; ``noise``: how far two rounds of one path fell apart."""
    out: dict[str, Any] = {}
    mean = {name: {k: sum(r[k] for r in runs) / len(runs) for k in ("rps", "p50_ms", "p99_ms")}
            for name, runs in row.items()}
    for name, m in mean.items():
        out.update({f"{name}_rps": round(m["rps"], 1), f"{name}_p50_ms": round(m["p50_ms"], 3),
                    f"{name}_p99_ms": round(m["p99_ms"], 3),
                    f"{name}_errors": sum(r["errors"] for r in row[name])})
        if name != "direct":
            out[f"{name}_added_p50_ms"] = round(m["p50_ms"] - mean["direct"]["p50_ms"], 3)
            for k in ("extproc", "envoy"):  # CPU seconds per 1,000 requests, the rounds' mean
                out[f"{name}_{k}_cpu_s_per_1k"] = round(sum(
                    r[f"{k}_cpu_s_per_1k"] for r in row[name]) / len(row[name]), 3)
    one, three = mean["replicas1"], mean["replicas3"]
    out["rps_3_vs_1"] = round(three["rps"] / one["rps"], 3)
    out["added_p50_3_minus_1_ms"] = round(three["p50_ms"] - one["p50_ms"], 3)
    preferred = mean["replicas3p"]
    out["rps_3p_vs_1"] = round(preferred["rps"] / one["rps"], 3)
    out["added_p50_3p_minus_1_ms"] = round(preferred["p50_ms"] - one["p50_ms"], 3)
    runs = [row[name] for name in ("replicas1", "replicas3", "replicas3p")]
    out["noise_rps"] = round(max(abs(a["rps"] - b["rps"]) / max(a["rps"], b["rps"])
                                 for a, b in (rs[:2] for rs in runs)), 3) if ROUNDS > 1 else 0.0
    out["noise_p50_ms"] = round(max(abs(a["p50_ms"] - b["p50_ms"]) for a, b in
                                    (rs[:2] for rs in runs)), 3) if ROUNDS > 1 else 0.0
    out["rounds"] = ROUNDS
    out["commands"] = {name: r[0]["command"] for name, r in row.items()}
    return out


def _swap(ha: HaStack, url: str, target: str, pool: ThreadPoolExecutor) -> dict[str, Any]:
    """HELD concurrent requests for ``target`` through ``url``; each one's time to served."""
    def one(_: int) -> tuple[float, int, str]:
        sent = time.monotonic()
        status, headers = services.post(url, chat(target), timeout=30)
        return time.monotonic() - sent, status, headers.get("x-served-by", "")
    sent = time.time()
    replies = list(pool.map(one, range(HELD)))
    done = time.time()
    settled = _wait(lambda: ha.settled_on(target), 10) is not None
    return {"target": target, "sent": sent, "done": done, "latencies": [r[0] for r in replies],
            "failed": sum(1 for r in replies if r[1] != 200 or r[2] != target),
            "settled": settled}


def _wall(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(entry["ts"]).replace("Z", "+00:00")).timestamp()


def _stages(log: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, float] | None:
    """One swap's stages from the leader's log (millisecond timestamps): requests sent ->
    SwapStarted (decide), -> incumbent scaled to 0 (drain), -> target scaled to 1 (unload),
    -> last request served (load and release); None when an entry is missing."""
    target = run["target"]
    source = "a" if target == "b" else "b"
    window = [e for e in log if run["sent"] - 0.002 <= _wall(e) <= run["done"]]
    def first(match: Callable[[dict[str, Any]], bool]) -> float | None:
        return next((_wall(e) for e in window if match(e)), None)
    started = first(lambda e: e.get("event") == "SwapStarted" and e.get("member") == target)
    down = first(lambda e: e.get("msg") == "member scaled" and e.get("member") == source
                 and e.get("replicas") == 0)
    up = first(lambda e: e.get("msg") == "member scaled" and e.get("member") == target
               and e.get("replicas") == 1)
    if started is None or down is None or up is None:
        return None
    return {"decide": started - run["sent"], "drain": down - started, "unload": up - down,
            "load_and_release": run["done"] - up}


def _breakdown(ha: HaStack, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median stages of ``runs`` from the log of the replica that led each."""
    logs = {r.name: read_log(r.log_path) for r in ha.stack.replicas}
    rows = [row for run in runs if (row := _stages(logs.get(run["leader"], []), run))]
    if not rows:
        return {"swaps": 0}
    return {"swaps": len(rows), **{k: ms(median(r[k] for r in rows)) for k in rows[0]}}


def _swap_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = [x for r in runs for x in r["latencies"]]
    return {"swaps": len(runs), "requests": len(latencies),
            "served_p50_ms": ms(percentile(latencies, 50)),
            "served_p90_ms": ms(percentile(latencies, 90)),
            "served_max_ms": ms(max(latencies)) if latencies else None,
            "swap_p50_ms": ms(median(max(r["latencies"]) for r in runs)) if runs else None,
            "failed_requests": sum(r["failed"] for r in runs),
            "unsettled_swaps": sum(1 for r in runs if not r["settled"])}


def swaps(bench: HaBench, writes: dict[str, Any]) -> dict[str, Any]:
    """Swaps through the leader and through a follower (3 replicas), and on 1 replica."""
    three, one = bench.stacks[3], bench.stacks[1]
    runs: dict[str, list[dict[str, Any]]] = {"leader": [], "follower": [], "replicas1": []}
    resident = {3: "a", 1: "a"}
    with ThreadPoolExecutor(HELD) as pool:
        window = WriteWindow(three).open()
        for i in range(SWAPS_PER_PATH * 2):
            path = PATHS[i % len(PATHS)]
            boss = three.leader()
            followers = three.followers()
            replica = boss if path == "leader" else followers[(i // 2) % len(followers)]
            target = "b" if resident[3] == "a" else "a"
            run = _swap(three, three.url(replica), target, pool)
            run.update(replica=replica, leader=boss, leader_after=three.leader())
            runs[path].append(run)
            resident[3] = target
            time.sleep(SWAP_PAUSE)
        writes["replicas3"] = {**window.close(), "swaps": SWAPS_PER_PATH * 2}
        window = WriteWindow(one).open()
        for _ in range(SWAPS_PER_PATH):
            target = "b" if resident[1] == "a" else "a"
            runs["replicas1"].append({**_swap(one, one.url(), target, pool),
                                      "leader": one.stack.replicas[0].name})
            resident[1] = target
            time.sleep(SWAP_PAUSE)
        writes["replicas1"] = {**window.close(), "swaps": SWAPS_PER_PATH}
    for ha, member in ((three, resident[3]), (one, resident[1])):
        if member != "a":  # leave both on a for what follows
            with ThreadPoolExecutor(HELD) as pool:
                _swap(ha, ha.url(), "a", pool)
    result: dict[str, Any] = {
        path: {**_swap_figures(r), "breakdown_p50_ms": _breakdown(one if path == "replicas1"
                                                                  else three, r)}
        for path, r in runs.items()}
    result["runs"] = [{"path": path, "via": r.get("replica", "replica-0"), "leader": r["leader"],
                       "target": r["target"], "served_ms": [ms(x) for x in r["latencies"]]}
                      for path, rs in runs.items() for r in rs]
    # a swap during which the leader changed measured something else
    result["leader_moved_during"] = sum(1 for path in ("leader", "follower") for r in runs[path]
                                        if r["leader_after"] != r["leader"])
    result["follower_minus_leader_p50_ms"] = round(
        result["follower"]["served_p50_ms"] - result["leader"]["served_p50_ms"], 2)
    result["follower_minus_leader_swap_p50_ms"] = round(
        result["follower"]["swap_p50_ms"] - result["leader"]["swap_p50_ms"], 2)
    print(f"  ha swaps: {result}", flush=True)
    return result


def _kill_trial(bench: HaBench) -> dict[str, Any]:
    """One leader SIGKILL mid-swap on the 3-replica stack (``a`` resident at the start)."""
    ha = bench.stacks[3]
    boss = ha.leader()
    streamer, trigger = ha.followers()[:2]
    asked_before = bench.probes_asked().get(f"{ha.namespace}/a", 0)
    out: dict[str, Any] = {"killed": boss, "stream_via": streamer, "trigger_via": trigger}
    with ThreadPoolExecutor(HELD + 1) as pool:
        stream = pool.submit(services.post, ha.url(streamer),
                             chat("a", tokens=STREAM_TOKENS, stream=True), 30)
        time.sleep(0.3)  # the stream is in flight on a
        sent = time.monotonic()
        held = [pool.submit(lambda: (services.post(ha.url(trigger), chat("b"), 90),
                                     time.monotonic())) for _ in range(HELD)]
        pending = _wait(lambda: ha.status().get("pendingMember") == "b", 10, 0.02)
        if pending is None:
            return {**out, "error": "the swap did not start within 10 s"}
        ha.replica(boss).kill()
        killed = time.monotonic()
        out["incumbent_up_at_kill"] = ha.replicas_of("a") >= 1
        taken = _wait(lambda: ha.leader() not in ("", boss), 40, 0.1)
        out["new_leader"] = ha.leader()
        replies = [f.result(timeout=100) for f in held]
        resident = _wait(lambda: ha.settled_on("b"), 10)
        stream_status = stream.result(timeout=30)[0]
    served = max(t for _, t in replies)
    out.update({
        "kill_after_request_ms": ms(killed - sent),
        "kill_to_new_leader_s": round(taken - killed, 2) if taken else None,
        "kill_to_served_s": round(served - killed, 2),
        "new_leader_to_served_s": round(served - taken, 2) if taken else None,
        "kill_to_resident_s": round(resident - killed, 2) if resident else None,
        "request_to_served_s": round(served - sent, 2),
        "held_served": sum(1 for (status, headers), _ in replies
                           if status == 200 and headers.get("x-served-by") == "b"),
        "held": HELD, "stream_status": stream_status,
        "idle_probes_of_incumbent": bench.probes_asked().get(f"{ha.namespace}/a", 0)
        - asked_before,
    })
    ha.replica(boss).restart(60)  # back to three for the next trial (it lists the pool)
    with ThreadPoolExecutor(HELD) as pool:
        _swap(ha, ha.url(), "a", pool)
    time.sleep(3)  # the restarted replica renews, every replica sees a resident again
    return out


def leader_kills(bench: HaBench, trials: int) -> dict[str, Any]:
    """``trials`` leader kills; the slowest of each figure is the one held to the target."""
    rows = []
    for _ in range(trials):
        rows.append(_kill_trial(bench))
        print(f"  ha leader kill: {rows[-1]}", flush=True)
    done = [r for r in rows if "error" not in r]
    def worst(key: str) -> float | None:
        values = [r[key] for r in done if r.get(key) is not None]
        return max(values) if len(values) == len(done) and values else None
    return {"trials": len(rows), "completed": len(done),
            "kill_to_served_max_s": worst("kill_to_served_s"),
            "kill_to_new_leader_max_s": worst("kill_to_new_leader_s"),
            "kill_to_resident_max_s": worst("kill_to_resident_s"),
            "held_served": sum(r.get("held_served", 0) for r in done),
            "held_sent": HELD * len(done), "runs": rows}


def run(workdir: Path) -> dict[str, Any]:
    """Everything above, on one pair of stacks; bounded (every wait has a timeout)."""
    bench = HaBench(workdir, LOAD_DELAY, UNLOAD_DELAY)
    result: dict[str, Any] = {"load_delay_s": LOAD_DELAY, "unload_delay_s": UNLOAD_DELAY,
                              "extproc_args": bench.extproc_args}
    try:
        bench.start()
        time.sleep(2)  # every replica has renewed since the warm-up
        writes: dict[str, Any] = {"rest": at_rest(bench, REST_SECONDS), "hits": {}, "swaps": {}}
        print(f"  ha at rest: {writes['rest']}", flush=True)
        result["hits"] = hits(bench, workdir, writes["hits"])
        result["swap"] = swaps(bench, writes["swaps"])
        result["api_writes"] = writes
        result["leader_kill"] = leader_kills(bench, KILL_TRIALS)
    finally:
        bench.stop()
    return result
