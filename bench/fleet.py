"""Part "fleet": what N pools cost the API server at rest, on a real kube-apiserver.

``python -m bench.fleet --pools 1,100,1000 --replicas 1,3`` (or ``python -m bench.run --only
fleet``). For each (pools, replicas): a fresh etcd + kube-apiserver (``make kube-tools``; the
control plane of tests/kube_real, with its JSON audit log), N ModelPools of three
InferenceServices each in one namespace (the first member Ready with one replica, the others
at zero), then the replicas started at once in own mode. Measured:

- start to synced: from the replicas' start until every replica's metrics name a resident
  member for every pool, on a first install (no pool has a status yet) and, at the end of
  the point, on a restart of every replica (a rollout: every status names its resident);
- settled: from the start until the replicas have sent nothing but Lease calls for 10 s (the
  lead's fences and first status writes are over);
- at rest, over a quiet window after that (nothing requested): the replicas' API
  requests per second and, of them, writes per second, counted from the audit log (each
  request once, by the time it was received); CPU (cores) and RSS of each replica;
- the leader SIGKILLed (at the largest N, several replicas): the time until another replica
  holds the leader Lease (it then leads every pool), until it is at rest again, and the writes
  other than Leases it sent meanwhile (its fences).

Every run is bounded: each wait has a timeout, and every process is stopped by its own pid.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from devstack import stack_manifests as manifests
from devstack.procs import LOCALHOST, PROJECT_ROOT

from . import services
from .procstat import cpu_seconds, memory_mb

sys.path.insert(0, str(PROJECT_ROOT / "tests" / "kube_real"))
from control_plane import USERS, ControlPlane, install_our_crds  # noqa: E402

NAMESPACE = "fleet"
USER = "modelpool-extproc"
WRITES = ("create", "update", "patch", "delete", "deletecollection")
LEASE = "modelpool-extproc-leader"
SETTLE = 10.0  # at rest: this long without a write other than the Leases' renews
SETTLE_LIMIT = 420.0  # ... waited for at most this long (the lead's fences at 1,000 pools)
QUIET = 20.0  # the window at rest


def _objects(pools: int) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) of every pool and member, members first."""
    group = f"/apis/{manifests.API_VERSION}/namespaces/{NAMESPACE}"
    members, pool_objs = [], []
    for i in range(pools):
        names = [f"p{i}-a", f"p{i}-b", f"p{i}-c"]
        for j, name in enumerate(names):
            obj = manifests.member(name, NAMESPACE, replicas=1 if j == 0 else 0)
            members.append((f"{group}/inferenceservices", obj))
        pool_objs.append((f"{group}/modelpools",
                          manifests.pool(f"p{i}", NAMESPACE, names, default=names[0])))
    return members + pool_objs


def populate(plane: ControlPlane, pools: int) -> float:
    """Create the pools and members, the first member of each Ready; seconds it took."""
    started = time.monotonic()
    objects = _objects(pools)

    def create(item: tuple[str, dict[str, Any]]) -> None:
        path, obj = item
        plane.request("POST", path, obj)
        if obj["kind"] == "InferenceService" and obj["spec"]["replicas"] == 1:
            name = obj["metadata"]["name"]
            plane.request("PATCH", f"{path}/{name}/status", {"status": {"phase": "Ready"}},
                          content_type="application/merge-patch+json")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, objects))
    return time.monotonic() - started


def scrape(port: int) -> str:
    """A replica's /metrics text ("" when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://{LOCALHOST}:{port}/metrics", timeout=10) as resp:
            return resp.read().decode()
    except (OSError, urllib.error.URLError):
        return ""


def resident_pools(text: str) -> int:
    """How many pools a replica's metrics name a resident member for."""
    pools = set()
    for line in text.splitlines():
        if line.startswith("llmkube_modelpool_resident{") and line.endswith(" 1.0"):
            labels = line[line.index("{") + 1:line.index("}")]
            fields = dict(part.split("=", 1) for part in labels.split(","))
            pools.add(fields.get("pool"))
    return len(pools)


def holder(plane: ControlPlane) -> str:
    """The leader Lease's holder ("" if none)."""
    try:
        lease = plane.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}"
                                     f"/leases/{LEASE}")
    except urllib.error.HTTPError:
        return ""
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def received(event: dict[str, Any]) -> float:
    """An audit event's requestReceivedTimestamp, seconds since the epoch."""
    return _epoch(event["requestReceivedTimestamp"])


def completed(event: dict[str, Any]) -> float:
    """An audit event's stageTimestamp (its stage's end), seconds since the epoch."""
    return _epoch(event["stageTimestamp"])


def _epoch(stamp: str) -> float:
    """An audit timestamp (RFC 3339, UTC) as seconds since the epoch."""
    return datetime.fromisoformat(stamp.rstrip("Z") + "+00:00").timestamp()


def requests_between(plane: ControlPlane, start: float, end: float) -> list[dict[str, Any]]:
    """The replicas' requests received in [start, end), each once (by its audit ID)."""
    seen: dict[str, dict[str, Any]] = {}
    for event in plane.audit_events():
        if (event.get("user") or {}).get("username") != USER:
            continue
        if start <= received(event) < end:
            seen.setdefault(event["auditID"], event)
    return list(seen.values())


def settle(plane: ControlPlane, since: float) -> float:
    """Seconds from ``since`` (monotonic) until the replicas sent nothing but Lease calls for
    SETTLE seconds (the lead's fences and status writes done); -1 past SETTLE_LIMIT."""
    def quiet() -> bool:
        now = time.time()
        return not [c for c in requests_between(plane, now - SETTLE, now)
                    if c["verb"] in WRITES and c["objectRef"].get("resource") != "leases"]
    time.sleep(SETTLE)
    try:
        wait_for(quiet, SETTLE_LIMIT, "at rest", every=5.0)
    except TimeoutError:
        return -1.0
    return time.monotonic() - since - SETTLE


def wait_for(check: Any, timeout: float, what: str, every: float = 0.2) -> float:
    """Seconds until ``check()`` is truthy; TimeoutError past ``timeout``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not after {timeout:.0f}s")
        time.sleep(every)
    return time.monotonic() - started


def start_replicas(work: Path, kubeconfig: Path, replicas: int, pools: int,
                   procs: list[services.ExtProc]) -> float:
    """Start the replicas at once (appended to ``procs``, r<i> at index i); seconds until
    every replica's metrics name a resident member for every pool."""
    started = time.monotonic()
    for i in range(replicas):
        proc = services.ExtProc(work, f"r{i}", services.EXTPROC, "--kubeconfig",
                                str(kubeconfig), "--namespace", NAMESPACE,
                                "--lease-namespace", NAMESPACE, "--replica-name", f"r{i}")
        procs.append(proc)
        proc.start()
    wait_for(lambda: all(resident_pools(scrape(p.metrics_port)) >= pools for p in procs),
             600, "every pool synced")
    return round(time.monotonic() - started, 1)


def run_one(work: Path, pools: int, replicas: int, kill: bool) -> dict[str, Any]:
    """One (pools, replicas) point on a fresh control plane."""
    plane = ControlPlane(work / "plane")
    procs: list[services.ExtProc] = []  # replica r<i> is procs[i]
    result: dict[str, Any] = {"pools": pools, "replicas": replicas}
    plane.start()
    try:
        install_our_crds(plane)
        plane.ensure_namespace(NAMESPACE)
        result["populate_s"] = round(populate(plane, pools), 1)
        kubeconfig = plane.write_kubeconfig(work / "extproc.kubeconfig",
                                            token=plane.token_of(USER), namespace=NAMESPACE)
        started = time.monotonic()
        result["synced_s"] = start_replicas(work, kubeconfig, replicas, pools, procs)
        wait_for(lambda: holder(plane), 60, "a leader")
        result["settled_s"] = round(settle(plane, started), 1)
        cpu0 = [cpu_seconds(p.pid) for p in procs]
        t0 = time.time()
        time.sleep(QUIET)
        t1 = time.time()
        cpu1 = [cpu_seconds(p.pid) for p in procs]
        calls = requests_between(plane, t0, t1)
        per = len(calls) / QUIET / replicas
        writes = [c for c in calls if c["verb"] in WRITES]
        result.update({
            "requests_per_s_per_replica": round(per, 2),
            "writes_per_s_per_replica": round(len(writes) / QUIET / replicas, 2),
            "requests_per_s_total": round(len(calls) / QUIET, 2),
            "calls_by_verb_resource": dict(Counter(
                f"{c['verb']} {c['objectRef'].get('resource', '')}" for c in calls)),
            "cpu_cores": [round((b - a) / QUIET, 4) for a, b in zip(cpu0, cpu1)],
            "rss_mb": [round(memory_mb(p.pid)["VmRSS"], 1) for p in procs],
        })
        if kill and replicas > 1:
            boss = holder(plane)
            victim = procs[int(boss.removeprefix("r"))]
            killed_at = time.time()
            os.kill(victim.pid, signal.SIGKILL)
            took = wait_for(lambda: holder(plane) not in ("", boss), 120, "a new leader", 0.1)
            result["settled_after_kill_s"] = round(settle(plane, time.monotonic() - took), 1)
            after = [c for c in requests_between(plane, killed_at, time.time())
                     if c["verb"] in WRITES and c["objectRef"].get("resource") != "leases"]
            result.update({"leader_killed_led_again_s": round(took, 1),
                           "writes_after_kill_non_lease": len(after)})
        # a restart (a rollout): every pool's status already names its resident
        for proc in procs:
            proc.stop()
        procs.clear()
        result["restart_synced_s"] = start_replicas(work, kubeconfig, replicas, pools, procs)
    finally:
        for proc in reversed(procs):
            proc.stop()
        plane.stop()
    return result


def run(work: Path, pool_counts: tuple[int, ...] = (1, 100, 1000),
        replica_counts: tuple[int, ...] = (1, 3), kill: bool = True) -> dict[str, Any]:
    """Every (pools, replicas) point; the part's result."""
    USERS.setdefault(USER, ("system:masters",))
    points = []
    for pools in pool_counts:
        for replicas in replica_counts:
            point = run_one(work / f"{pools}x{replicas}", pools, replicas,
                            kill and pools == max(pool_counts))
            print(json.dumps(point), flush=True)
            points.append(point)
    return {"quiet_window_s": QUIET, "settle_s": SETTLE, "points": points}


def main(argv: list[str] | None = None) -> None:
    """Run the part and print each point as a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", default="1,100,1000")
    parser.add_argument("--replicas", default="1,3")
    parser.add_argument("--no-kill", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fleet-") as work:
        run(Path(work), tuple(int(x) for x in args.pools.split(",")),
            tuple(int(x) for x in args.replicas.split(",")), kill=not args.no_kill)


if __name__ == "__main__":
    main()
