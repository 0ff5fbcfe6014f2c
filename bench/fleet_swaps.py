"""Part "fleet", swaps: what a swap costs while many other pools rest, on a real kube-apiserver.

``python -m bench.fleet_swaps`` (or ``python -m bench.run --only fleet``; needs ``make
kube-tools``). Each point starts a fresh etcd + kube-apiserver (tests/kube_real's control
plane), ``resting`` pools in namespace ``fleet`` exactly as the at-rest part makes them (three
members, the first Ready, no pods), and ``swapping`` pools of two members in namespace
``swap`` run by the local stack on that server: the member simulator playing the
InferenceService controller (pods, a simulated load and unload; every member's server in
the simulator's own process, as a process per member and its standby would be hundreds of
Python processes taking the cores the service needs), Envoy, and one ext_proc replica in own
mode watching both namespaces. Once the service has settled (no write of its own for a few
seconds: a lead gained over a thousand pools first stamps each one), each round sends one
request to every swapping pool's non-resident member at the same moment, through Envoy;
``rounds`` rounds swap back and forth. Measured per request:

- total: sent to served (the client's clock);
- the service's share: sent until its scale-down of the incumbent reaches the API server (the
  drain), the incumbent's pod gone until its scale-up of the target reaches the API server,
  the target Ready until served (the release) -- cut at the API server's audit log and the
  simulator's timeline, wall clocks of one host;
- the simulator's share: the rest (its reactions, unload and load delays, pod and server
  start);
- served right: answered 200 by the member it named (nothing lost, nothing misrouted);
- CPU seconds over the rounds of the ext_proc, the simulator, the API server with etcd,
  Envoy and the whole machine (other tenants included), against the rounds' wall time: a
  service share long beside little ext_proc CPU is waiting for a core, not work; the
  service's writes per swap and the API server's time on each (received to answered).

One swapping pool beside 0 and 999 resting shows one swap's overhead at 1 and 1,000 pools;
100 swapping at once shows the service's share when its work comes all at once.

Every wait is bounded and every process is stopped by its own pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from devstack import testkit
from devstack.procs import PROJECT_ROOT
from devstack.stack_manifests import pool_with_members

from .fleet import NAMESPACE as RESTING_NAMESPACE
from .fleet import USER, completed, received, populate
from .procstat import busy_seconds, cpu_seconds, tree_cpu_seconds
from .stats import percentile

sys.path.insert(0, str(PROJECT_ROOT / "tests" / "kube_real"))
sys.path.insert(0, str(PROJECT_ROOT / "tests" / "deploy"))
from control_plane import USERS, ControlPlane, install_our_crds  # noqa: E402
from real_stack import RealApiStack  # noqa: E402

SWAP_NAMESPACE = "swap"
LOAD, UNLOAD = 0.5, 0.2  # the simulator's delays (seconds)
START_TIMEOUT = 300.0  # the stack's start at 1,000 pools
REQUEST_TIMEOUT = 120.0
KUBE_REQUESTS = "modelpool_extproc_kube_requests_total"
AT_REST = 10.0  # seconds the ext_proc's CPU is measured at rest, once settled
SETTLED = 5.0  # seconds without a write of the service's (but its Lease renewals): started


def _pools(count: int) -> list[dict[str, Any]]:
    """``count`` pools of two members (``s<i>-a`` resident by default, ``s<i>-b``)."""
    docs: list[dict[str, Any]] = []
    for i in range(count):
        docs += pool_with_members(f"s{i}", SWAP_NAMESPACE, [f"s{i}-a", f"s{i}-b"],
                                  default=f"s{i}-a")
    return docs


@dataclass(frozen=True)
class Swap:
    """One request that swapped its pool: when it was sent and served (monotonic), and right."""

    incumbent: str
    target: str
    sent: float
    served: float
    right: bool
    answer: str  # status and the start of the body when not right


async def _ask(session: aiohttp.ClientSession, url: str, pool: int, side: str) -> Swap:
    """One request for pool ``pool``'s member ``side`` (the other member resident)."""
    target = f"s{pool}-{side}"  # a member's name is its model's (what /v1/models lists)
    reply = await testkit.chat(session, url, target, timeout=REQUEST_TIMEOUT)
    incumbent = f"s{pool}-{'a' if side == 'b' else 'b'}"
    right = reply.status == 200 and reply.served_by == target
    return Swap(incumbent, target, reply.began, reply.ended, right,
                "" if right else f"{reply.status} {reply.served_by} {reply.body[:120]}")


def _service_writes(plane: ControlPlane) -> list[dict[str, Any]]:
    """The service's completed writes in the swapping pools' namespace (audit log)."""
    return [e for e in plane.audit_events()
            if (e.get("user") or {}).get("username") == USER and e["verb"] == "patch"
            and e.get("stage") == "ResponseComplete"
            and e["objectRef"].get("namespace") == SWAP_NAMESPACE]


def _scale_writes(writes: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """(received, member) of each of the service's writes to a swapping pool's member (wall
    clock)."""
    return sorted((received(e), e["objectRef"].get("name", "")) for e in writes
                  if e["objectRef"].get("resource") == "inferenceservices")


def _write_load(writes: list[dict[str, Any]], start: float, end: float,
                swaps: int) -> dict[str, Any]:
    """The service's writes received in [start, end] (wall clock): how many per swap, and the
    API server's time on each (received to answered) -- its own queue under the burst."""
    within = [e for e in writes if start <= received(e) <= end]
    spent = [completed(e) - received(e) for e in within]
    return {"service_writes_per_swap": round(len(within) / max(1, swaps), 2),
            "api_write_s": _summary(spent) if spent else {}}


def _split(swap: Swap, timeline: list[dict[str, Any]], writes: list[tuple[float, str]],
           wall: float) -> dict[str, float] | None:
    """A swap's time cut where the work passes between the service and the simulator (wall
    clock, one host): the service's share is the request until its write to the incumbent
    (the drain and the scale-down), the incumbent's pod gone until its write to the target
    (the scale-up), the target Ready until served (the release); the simulator's is the rest.
    None when a mark is missing from the request's span."""
    sent, served = swap.sent + wall, swap.served + wall

    def event(member: str, name: str) -> float | None:
        return min((e["wall"] for e in timeline if e["member"] == member
                    and e["event"] == name and sent <= e["wall"] <= served), default=None)

    def write(member: str, after: float) -> float | None:
        return min((t for t, name in writes if name == member and after <= t <= served),
                   default=None)
    gone, ready = event(swap.incumbent, "pod_deleted"), event(swap.target, "ready")
    if gone is None or ready is None:
        return None
    down, up = write(swap.incumbent, sent), write(swap.target, gone)
    if down is None or up is None:
        return None
    cuts = {"to_scaled_down": down - sent, "to_scaled_up": up - gone,
            "to_released": served - ready}
    total, service = served - sent, sum(cuts.values())
    return {"total": total, "service": service, "simulator": total - service, **cuts}


def _cpu(stack: RealApiStack) -> dict[str, float]:
    """CPU seconds used so far by each piece (the simulator with its member servers) and by
    the whole machine (other tenants included): over a burst, whether the service's share is
    its own work or waiting for a core."""
    extproc, simulator = stack.replica(0).pid, stack.pid("simulator")
    assert extproc is not None and simulator is not None and stack.envoy is not None
    envoy = stack.envoy.process.pid
    assert envoy is not None
    return {"extproc": cpu_seconds(extproc), "simulator": tree_cpu_seconds(simulator),
            "apiserver_etcd": sum(cpu_seconds(p) for p in stack.plane.pids()),
            "envoy": cpu_seconds(envoy), "client": cpu_seconds(os.getpid()),
            "machine_busy": busy_seconds()}


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, 50), 3), "p99": round(percentile(values, 99), 3),
            "max": round(max(values), 3)}


async def _wait_all_resident(stack: RealApiStack, count: int, timeout: float) -> None:
    """Until every swapping pool's status names its default member resident and Ready."""
    deadline = time.monotonic() + timeout
    while True:
        items = (await asyncio.to_thread(
            stack.get, f"/apis/inference.llmkube.dev/v1alpha1/namespaces/{SWAP_NAMESPACE}"
                       "/modelpools"))["items"]
        ready = sum(1 for p in items if (p.get("status") or {}).get("phase") == "Ready"
                    and (p["status"].get("residentMember") or "").endswith("-a"))
        if ready >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ready} of {count} swapping pools resident")
        await asyncio.sleep(0.5)


def _writes_so_far(stack: RealApiStack) -> float:
    """The service's writes to the API server so far, its Lease renewals left out."""
    return sum(v for (name, labels), v in stack.metrics().items()
               if name == KUBE_REQUESTS and dict(labels).get("verb") in ("create", "patch")
               and dict(labels).get("resource") != "leases")


async def _wait_settled(stack: RealApiStack, timeout: float) -> dict[str, float]:
    """Until the service has sent no write for SETTLED seconds: a lead gained over a thousand
    pools stamps every one and writes its status, and a swap measured meanwhile would count
    that start-up as its overhead. The seconds it took, and the ext_proc's CPU seconds per
    second over AT_REST seconds after it, with nothing asked of it (its cost at rest: the
    wait itself scrapes its metrics, which at a thousand pools is not free)."""
    pid = stack.replica(0).pid
    assert pid is not None
    began = time.monotonic()
    deadline, last, since = began + timeout, -1.0, began
    while True:
        now, writes = time.monotonic(), await asyncio.to_thread(_writes_so_far, stack)
        if writes != last:
            last, since = writes, now
        elif now - since >= SETTLED:
            break
        if now > deadline:
            raise TimeoutError(f"the service still writing after {timeout}s")
        await asyncio.sleep(0.5)
    settled, cpu = time.monotonic() - began, cpu_seconds(pid)
    await asyncio.sleep(AT_REST)
    return {"settled_after_s": round(settled, 1),
            "extproc_at_rest_cpu": round((cpu_seconds(pid) - cpu) / AT_REST, 3)}


async def _measure(stack: RealApiStack, swapping: int, rounds: int,
                   settle: bool) -> dict[str, Any]:
    """Swap every pool ``rounds`` times (all pools at once each round), once the service has
    settled unless ``settle`` is False; the figures."""
    await _wait_all_resident(stack, swapping, START_TIMEOUT)
    settled = await _wait_settled(stack, START_TIMEOUT) if settle else {}
    swaps: list[Swap] = []
    before, began = _cpu(stack), time.monotonic()
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max(100, swapping))) as session:
        for r in range(rounds):
            side = "b" if r % 2 == 0 else "a"
            swaps += await asyncio.gather(*[_ask(session, stack.url, i, side)
                                            for i in range(swapping)])
    after, lasted = _cpu(stack), time.monotonic() - began
    wall = time.time() - time.monotonic()  # the replies' clock to the wall clock
    service = _service_writes(stack.plane)
    timeline, writes = stack.timeline(), _scale_writes(service)
    served = [s for s in swaps if s.right]
    splits = [cut for cut in (_split(s, timeline, writes, wall) for s in served)
              if cut is not None]
    wrong = Counter(s.answer for s in swaps if not s.right)
    result: dict[str, Any] = {"requests": len(swaps), "served_right": len(served),
                              "wrong": dict(wrong.most_common(3)),
                              "split": len(splits), **settled,
                              "rounds_wall_s": round(lasted, 2),
                              "cpu_s": {k: round(after[k] - before[k], 2) for k in before},
                              **_write_load(service, began + wall, began + lasted + wall,
                                            len(swaps))}
    for part in ("total", "service", "simulator", "to_scaled_down", "to_scaled_up",
                 "to_released"):
        result[f"{part}_s"] = _summary([cut[part] for cut in splits]) if splits else {}
    return result


def run_one(work: Path, resting: int, swapping: int, rounds: int,
            settle: bool = True) -> dict[str, Any]:
    """One point: ``resting`` pools at rest, ``swapping`` pools swapped ``rounds`` times (once
    the service has settled, unless ``settle`` is False: during its start-up)."""
    USERS.setdefault(USER, ("system:masters",))
    plane = ControlPlane(work / "plane")
    plane.start()
    result: dict[str, Any] = {"resting": resting, "swapping": swapping, "rounds": rounds,
                              "load_s": LOAD, "unload_s": UNLOAD}
    try:
        install_our_crds(plane)
        plane.ensure_namespace(RESTING_NAMESPACE)
        populate(plane, resting)
        stack = RealApiStack(plane, work / "stack", _pools(swapping),
                             extproc_token=plane.token_of(USER), load_delay=LOAD,
                             unload_delay=UNLOAD, runtime="fake-in-process",
                             extproc_args=["--namespace", RESTING_NAMESPACE])
        stack.start(timeout=START_TIMEOUT)
        try:
            result.update(asyncio.run(_measure(stack, swapping, rounds, settle)))
        finally:
            stack.stop()
    finally:
        plane.stop()
    return result


def run(work: Path, points: tuple[tuple[int, int, int], ...] = (
        (0, 1, 12), (999, 1, 12), (0, 100, 2), (900, 100, 2)),
        settle: bool = True) -> dict[str, Any]:
    """Every (resting, swapping, rounds) point; the part's result."""
    results = []
    for resting, swapping, rounds in points:
        point = run_one(work / f"{resting}r{swapping}s", resting, swapping, rounds, settle)
        print(json.dumps(point), flush=True)
        results.append(point)
    return {"swap_points": results}


def main(argv: list[str] | None = None) -> None:
    """Run the part and print each point as a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", action="append", default=[], metavar="RESTING,SWAPPING,ROUNDS",
                        help="a point to run (repeatable); default: 0,1,12 999,1,12 0,100,2 "
                             "900,100,2")
    parser.add_argument("--unsettled", action="store_true",
                        help="swap as soon as the swapping pools are resident, the service's "
                             "start-up (its stamps of every pool) still under way")
    args = parser.parse_args(argv)
    points = tuple(tuple(int(x) for x in p.split(",")) for p in args.point)
    with tempfile.TemporaryDirectory(prefix="fleet-swaps-") as work:
        if points:
            run(Path(work), points, not args.unsettled)  # type: ignore[arg-type]
        else:
            run(Path(work), settle=not args.unsettled)


if __name__ == "__main__":
    main()
