"""Part "fleet", swaps: what a swap costs while many other pools rest, on a real kube-apiserver.

``python -m bench.fleet_swaps`` (or ``python -m bench.run --only fleet``; needs ``make
kube-tools``). Each point starts a fresh etcd + kube-apiserver (tests/kube_real's control
plane), ``resting`` pools in namespace ``fleet`` exactly as the at-rest part makes them (three
members, the first Ready, no pods), and ``swapping`` pools of two members in namespace
``swap`` run by the local stack on that server: the member simulator playing the
InferenceService controller (pods, a simulated load and unload), Envoy, and one ext_proc
replica in own mode watching both namespaces. Each round sends one request to every swapping
pool's non-resident member at the same moment, through Envoy; ``rounds`` rounds swap back and
forth. Measured per request:

- total: sent to served (the client's clock);
- the service's share: sent until the incumbent's pod is terminating (drain, scale to zero),
  the incumbent's pod gone until the target's pod exists (the scale-up), the target Ready
  until served (the release) -- cut at the simulator's timeline, on the same monotonic clock;
- the simulator's share: the rest (unload and load delays, its pod and server start);
- served right: answered 200 by the member it named (nothing lost, nothing misrouted).

One swapping pool beside 0 and 999 resting shows one swap's overhead at 1 and 1,000 pools;
100 swapping at once shows the service's share when its work comes all at once.

Every wait is bounded and every process is stopped by its own pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from devstack import testkit
from devstack.procs import PROJECT_ROOT
from devstack.stack_manifests import pool_with_members

from .fleet import NAMESPACE as RESTING_NAMESPACE
from .fleet import USER, populate
from .stats import percentile

sys.path.insert(0, str(PROJECT_ROOT / "tests" / "kube_real"))
sys.path.insert(0, str(PROJECT_ROOT / "tests" / "deploy"))
from control_plane import USERS, ControlPlane, install_our_crds  # noqa: E402
from real_stack import RealApiStack  # noqa: E402

SWAP_NAMESPACE = "swap"
LOAD, UNLOAD = 0.5, 0.2  # the simulator's delays (seconds)
START_TIMEOUT = 300.0  # the stack's start at 1,000 pools
REQUEST_TIMEOUT = 120.0


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


async def _ask(session: aiohttp.ClientSession, url: str, pool: int, side: str) -> Swap:
    """One request for pool ``pool``'s member ``side`` (the other member resident)."""
    target = f"s{pool}-{side}"  # a member's name is its model's (what /v1/models lists)
    reply = await testkit.chat(session, url, target, timeout=REQUEST_TIMEOUT)
    incumbent = f"s{pool}-{'a' if side == 'b' else 'b'}"
    return Swap(incumbent, target, reply.began, reply.ended,
                reply.status == 200 and reply.served_by == target)


def _split(swap: Swap, timeline: list[dict[str, Any]]) -> dict[str, float] | None:
    """A swap's time cut at the simulator's events (its clock is the same monotonic one):
    the service's share (request to the incumbent's pod terminating, its pod gone to the
    target's pod created, the target Ready to served) and the simulator's (the rest); None
    when an event is missing from the request's span."""
    def at(member: str, event: str) -> float | None:
        return min((e["t"] for e in timeline if e["member"] == member and e["event"] == event
                    and swap.sent <= e["t"] <= swap.served), default=None)
    marks = (at(swap.incumbent, "pod_terminating"), at(swap.incumbent, "pod_deleted"),
             at(swap.target, "pod_created"), at(swap.target, "ready"))
    if None in marks:
        return None
    terminating, gone, created, ready = (float(m) for m in marks)  # type: ignore[arg-type]
    total = swap.served - swap.sent
    cuts = {"to_drained": terminating - swap.sent, "to_scaled_up": created - gone,
            "to_released": swap.served - ready}
    service = sum(cuts.values())
    return {"total": total, "service": service, "simulator": total - service, **cuts}


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


async def _measure(stack: RealApiStack, swapping: int, rounds: int) -> dict[str, Any]:
    """Swap every pool ``rounds`` times (all pools at once each round); the figures."""
    await _wait_all_resident(stack, swapping, START_TIMEOUT)
    swaps: list[Swap] = []
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max(100, swapping))) as session:
        for r in range(rounds):
            side = "b" if r % 2 == 0 else "a"
            swaps += await asyncio.gather(*[_ask(session, stack.url, i, side)
                                            for i in range(swapping)])
    timeline = stack.timeline()
    served = [s for s in swaps if s.right]
    splits = [cut for cut in (_split(s, timeline) for s in served) if cut is not None]
    result: dict[str, Any] = {"requests": len(swaps), "served_right": len(served),
                              "split": len(splits)}
    for part in ("total", "service", "simulator", "to_drained", "to_scaled_up", "to_released"):
        result[f"{part}_s"] = _summary([cut[part] for cut in splits]) if splits else {}
    return result


def run_one(work: Path, resting: int, swapping: int, rounds: int) -> dict[str, Any]:
    """One point: ``resting`` pools at rest, ``swapping`` pools swapped ``rounds`` times."""
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
                             unload_delay=UNLOAD,
                             extproc_args=["--namespace", RESTING_NAMESPACE])
        stack.start(timeout=START_TIMEOUT)
        try:
            result.update(asyncio.run(_measure(stack, swapping, rounds)))
        finally:
            stack.stop()
    finally:
        plane.stop()
    return result


def run(work: Path, points: tuple[tuple[int, int, int], ...] = (
        (0, 1, 12), (999, 1, 12), (0, 100, 2), (900, 100, 2))) -> dict[str, Any]:
    """Every (resting, swapping, rounds) point; the part's result."""
    results = []
    for resting, swapping, rounds in points:
        point = run_one(work / f"{resting}r{swapping}s", resting, swapping, rounds)
        print(json.dumps(point), flush=True)
        results.append(point)
    return {"swap_points": results}


def main(argv: list[str] | None = None) -> None:
    """Run the part and print each point as a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", action="append", default=[], metavar="RESTING,SWAPPING,ROUNDS",
                        help="a point to run (repeatable); default: 0,1,12 999,1,12 0,100,2 "
                             "900,100,2")
    args = parser.parse_args(argv)
    points = tuple(tuple(int(x) for x in p.split(",")) for p in args.point)
    with tempfile.TemporaryDirectory(prefix="fleet-swaps-") as work:
        if points:
            run(Path(work), points)  # type: ignore[arg-type]
        else:
            run(Path(work))


if __name__ == "__main__":
    main()
