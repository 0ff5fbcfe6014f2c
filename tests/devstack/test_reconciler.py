"""The LLMKube stand-in (devstack.reconciler) against the emulator and the member simulator.

The test plays LLMKube's activator: it only scales a member 0 -> 1, as the router-proxy (or the
ext_proc in llmkube mode) does, and checks what the reconciler makes of it, from the API and
from the emulator's event history and request record.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from kubernetes.aio import watch

from devstack import stack_manifests as manifests
from devstack.procs import PROJECT_ROOT
from devstack.reconciler import POOLS, USER, ModelPoolReconciler
from devstack.simulator import MemberSimulator
from devstack.simulator_kube import GROUP, PLURAL, VERSION
from devstack.testkit import finish_within
from devstack.upstream import TOKEN_DELAY_ENV
from devstack_cluster import NS, Cluster, eventually

POOL = "gpu"
REQUEUE = 0.3  # LLMKube's 3 s, shortened so a test's swaps take a second, not ten
IDLE_TIMEOUT = 0.3
# A Deployment's hops before a pod exists: the window in which an early trigger must be held.
ROLLOUT = 0.3
SWAP_TIMEOUT = 15.0


async def pool_status(cluster: Cluster) -> dict[str, Any]:
    """The pool's status as the API holds it."""
    pool = await cluster.custom.get_namespaced_custom_object(GROUP, VERSION, NS, POOLS, POOL)
    return pool.get("status") or {}


def condition(status: dict[str, Any], kind: str) -> tuple[str, str] | None:
    """(status, reason) of one condition, None when absent."""
    found = [c for c in status.get("conditions") or [] if c["type"] == kind]
    return (found[0]["status"], found[0]["reason"]) if found else None


async def replicas(cluster: Cluster, member: str) -> int:
    """A member's spec.replicas."""
    return (await cluster.isvc(member))["spec"]["replicas"]


async def resident_is(cluster: Cluster, member: str) -> dict[str, Any] | None:
    """The pool's status once `member` is resident, the pool Ready and nothing pending."""
    status = await pool_status(cluster)
    done = status.get("residentMember") == member and status.get("phase") == "Ready" \
        and not status.get("pendingMember")
    return status if done else None


async def history(cluster: Cluster, list_fn: Callable[..., Awaitable[Any]], *args: Any,
                  since: str) -> list[tuple[str, dict[str, Any]]]:
    """Every (type, object) event after version `since`, replayed by a watch from there."""
    events = []
    stream = watch.Watch().stream(list_fn, *args, resource_version=since, timeout_seconds=1)
    async with stream:
        async for event in stream:
            if event["type"] != "BOOKMARK":
                events.append((event["type"], event["raw_object"]))
    return events


async def pod_history(cluster: Cluster, since: str) -> list[set[str]]:
    """The set of members holding pods (terminating ones included) after each pod event."""
    present: dict[str, str] = {}  # pod name -> member
    states = []
    for kind, pod in await history(cluster, cluster.core.list_namespaced_pod, NS, since=since):
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            present.pop(name, None)
        else:
            present[name] = pod["metadata"]["labels"]["inference.llmkube.dev/service"]
        states.append(set(present.values()))
    return states


async def replica_history(cluster: Cluster, member: str, since: str) -> list[int]:
    """The member's spec.replicas after each change of it, in order, repeats collapsed."""
    values: list[int] = []
    events = await history(cluster, cluster.custom.list_namespaced_custom_object,
                           GROUP, VERSION, NS, PLURAL, since=since)
    for _, obj in events:
        if obj["metadata"]["name"] == member:
            value = obj["spec"]["replicas"]
            if not values or values[-1] != value:
                values.append(value)
    return values


def version_now(cluster: Cluster) -> str:
    """The emulator's latest resourceVersion, to replay history from."""
    return str(cluster.emu.store.resource_version)


def calls(cluster: Cluster, user: str, verb: str, resource: str,
          subresource: str | None = None) -> list[Any]:
    """The user's recorded requests with this verb on this resource (and subresource)."""
    return [r for r in cluster.emu.requests_of(user)
            if r.verb == verb and r.resource == resource and r.subresource == subresource]


Stack = tuple[MemberSimulator, ModelPoolReconciler]


@pytest.fixture
async def llmkube(cluster: Cluster, sims) -> AsyncIterator[Callable[..., Awaitable[Stack]]]:
    """Create members and the pool, then start the simulator and the stand-in on them."""
    started: list[ModelPoolReconciler] = []

    async def start(members: tuple[str, ...] = ("judge", "coder"), default: str = "judge",
                    pool_members: tuple[str, ...] | None = None) -> Stack:
        for name in members:
            await cluster.create(name, replicas=0)
        pool = manifests.pool(POOL, NS, pool_members or members, default=default)
        await cluster.custom.create_namespaced_custom_object(GROUP, VERSION, NS, POOLS, pool)
        sim = await sims(rollout_delay=ROLLOUT)
        reconciler = ModelPoolReconciler(cluster.kubeconfig_for(USER), [NS], requeue=REQUEUE,
                                         idle_timeout=IDLE_TIMEOUT)
        started.append(reconciler)
        await reconciler.start()
        return sim, reconciler

    try:
        yield start
    finally:
        for n, reconciler in enumerate(started):
            await finish_within(reconciler.stop(), 30,
                                f"reconciler #{n} to stop (its watches, pool workers, session)")


async def warm(cluster: Cluster, llmkube) -> Stack:
    """A pool whose default, judge, is resident and Ready."""
    stack = await llmkube()
    await eventually(lambda: resident_is(cluster, "judge"), SWAP_TIMEOUT, "judge warmed")
    return stack


async def test_a_cold_pool_warms_its_default_and_reports_the_full_status(cluster: Cluster,
                                                                         llmkube):
    since = version_now(cluster)
    await llmkube()
    status = await eventually(lambda: resident_is(cluster, "judge"), SWAP_TIMEOUT, "warm judge")

    assert await replicas(cluster, "judge") == 1 and await replicas(cluster, "coder") == 0
    pool = await cluster.custom.get_namespaced_custom_object(GROUP, VERSION, NS, POOLS, POOL)
    assert status["observedGeneration"] == pool["metadata"]["generation"]
    assert status["members"] == [{"name": "judge", "resident": True, "phase": "Ready"},
                                 {"name": "coder", "resident": False, "phase": "Stopped"}]
    assert condition(status, "SlotAllocated") == ("True", "Resident")
    assert condition(status, "MembersValid") == ("True", "AllResolved")
    assert condition(status, "SwapDeferred") == ("False", "NotDeferred")
    assert condition(status, "MetalSupported") == ("True", "KubernetesGPU")
    # on the way it said what it was warming
    phases = [(o.get("status") or {}).get("phase") for _, o in await history(
        cluster, cluster.custom.list_namespaced_custom_object, GROUP, VERSION, NS, POOLS,
        since=since)]
    assert phases[-1] == "Ready" and "Pending" in phases

    # as LLMKube: its own user, merge patches on replicas and status, no Events, no pod watch
    assert calls(cluster, USER, "patch", PLURAL) and calls(cluster, USER, "patch", POOLS, "status")
    mine = cluster.emu.requests_of(USER)
    assert not [r for r in mine if r.resource == "events"]
    assert not [r for r in mine if r.resource == "pods" and r.verb == "watch"]
    assert {r.resource for r in mine if r.verb == "watch"} == {POOLS, PLURAL}


async def test_an_activator_trigger_swaps_through_pending_member(cluster: Cluster, llmkube):
    await warm(cluster, llmkube)
    since = version_now(cluster)

    await cluster.scale("coder", 1)  # the activator's only write
    swapping = await eventually(lambda: _pending(cluster, "coder"), SWAP_TIMEOUT, "pending")
    assert swapping["phase"] == "Swapping" and swapping["residentMember"] == "judge"
    assert condition(swapping, "SlotAllocated") == ("False", "Swapping")
    status = await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "coder")

    assert await replicas(cluster, "judge") == 0 and await replicas(cluster, "coder") == 1
    assert status["members"] == [{"name": "judge", "resident": False, "phase": "Stopped"},
                                 {"name": "coder", "resident": True, "phase": "Ready"}]
    # the early trigger was patched back to 0 while judge's pods existed, then up again
    assert await replica_history(cluster, "coder", since) == [1, 0, 1]
    assert await replica_history(cluster, "judge", since) == [0]
    holding = await pod_history(cluster, since)
    assert holding and all(len(members) <= 1 for members in holding), holding
    assert holding[-1] == {"coder"}


async def test_a_busy_incumbent_defers_the_swap_until_it_is_idle(
        cluster: Cluster, llmkube, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(TOKEN_DELAY_ENV, "100")  # a 200-token stream lasts 20 s: busy for sure
    sim, _ = await warm(cluster, llmkube)
    url = f"http://127.0.0.1:{sim.ports['judge']}/v1/chat/completions"
    body = {"model": "judge", "stream": True, "max_tokens": 200,
            "messages": [{"role": "user", "content": "write at length"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body) as stream:
            await stream.content.readline()  # the generation is under way
            await cluster.scale("coder", 1)
            deferred = await eventually(lambda: _deferred(cluster, "PodsBusy"), SWAP_TIMEOUT,
                                        "SwapDeferred PodsBusy")
            assert deferred["pendingMember"] == "coder" and deferred["phase"] == "Swapping"
            # the incumbent is left serving; the target waits at 0 without a pod
            assert await replicas(cluster, "judge") == 1
            assert (await cluster.status("judge"))["phase"] == "Ready"
            assert await replicas(cluster, "coder") == 0 and await cluster.pods("coder") == []
            assert not stream.content.at_eof()
        # the client is done: the next probe finds judge idle and the swap goes ahead
    status = await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "coder")
    assert condition(status, "SwapDeferred") == ("False", "NotDeferred")


async def test_an_unanswered_idle_probe_defers_the_swap(cluster: Cluster, llmkube):
    sim, _ = await warm(cluster, llmkube)
    server = sim.actors[(NS, "judge")].server
    assert server is not None
    os.kill(server.process.pid, signal.SIGSTOP)  # judge hangs: /slots does not answer
    try:
        await cluster.scale("coder", 1)
        deferred = await eventually(lambda: _deferred(cluster, "IdleCheckFailed"),
                                    SWAP_TIMEOUT, "SwapDeferred IdleCheckFailed")
        assert deferred["pendingMember"] == "coder"
        assert await replicas(cluster, "judge") == 1  # fail closed: never a forced unload
        assert await replicas(cluster, "coder") == 0 and await cluster.pods("coder") == []
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    await eventually(lambda: resident_is(cluster, "coder"), SWAP_TIMEOUT, "coder")


async def test_a_resident_scaled_down_by_someone_else_is_scaled_back(cluster: Cluster, llmkube):
    await warm(cluster, llmkube)
    since = version_now(cluster)
    patches_before = len(calls(cluster, USER, "patch", PLURAL))

    await cluster.scale("judge", 0)  # what an own-mode service does to drain the incumbent
    await eventually(lambda: _replicas_is(cluster, "judge", 1), SWAP_TIMEOUT, "judge back at 1")
    await eventually(lambda: resident_is(cluster, "judge"), SWAP_TIMEOUT, "judge Ready again")

    assert await replica_history(cluster, "judge", since) == [0, 1]
    scaled = calls(cluster, USER, "patch", PLURAL)[patches_before:]
    assert [r.name for r in scaled] == ["judge"]  # the reconciler undid it, and did nothing else
    assert await replicas(cluster, "coder") == 0


@pytest.mark.parametrize("fault", ["metal member", "missing member"])
async def test_a_pool_it_cannot_manage_is_degraded_and_left_alone(cluster: Cluster, llmkube,
                                                                  fault: str):
    if fault == "metal member":
        await cluster.create("mac", replicas=0)
        await cluster.patch("mac", {"spec": {"accelerator": "metal"}})
        await llmkube(pool_members=("judge", "mac"))
        expected = {"MetalSupported": ("False", "MetalMembersUnsupported"),
                    "MembersValid": ("True", "AllResolved")}
    else:
        await llmkube(pool_members=("judge", "ghost"))
        expected = {"MetalSupported": ("True", "KubernetesGPU"),
                    "MembersValid": ("False", "MissingMembers")}
    status = await eventually(lambda: _phase_is(cluster, "Degraded"), SWAP_TIMEOUT, "Degraded")

    assert {kind: condition(status, kind) for kind in expected} == expected
    assert not status.get("residentMember") and not status.get("pendingMember")
    assert calls(cluster, USER, "patch", PLURAL) == []  # not even the default is warmed
    assert await replicas(cluster, "judge") == 0


async def _pending(cluster: Cluster, member: str) -> dict[str, Any] | None:
    status = await pool_status(cluster)
    return status if status.get("pendingMember") == member else None


async def _deferred(cluster: Cluster, reason: str) -> dict[str, Any] | None:
    status = await pool_status(cluster)
    return status if condition(status, "SwapDeferred") == ("True", reason) else None


async def _replicas_is(cluster: Cluster, member: str, value: int) -> bool:
    return await replicas(cluster, member) == value


async def _phase_is(cluster: Cluster, phase: str) -> dict[str, Any] | None:
    status = await pool_status(cluster)
    return status if status.get("phase") == phase else None



async def test_the_cli_warms_the_pool_and_stops_on_sigterm(cluster: Cluster, sims,
                                                            tmp_path: Path):
    for name in ("judge", "coder"):
        await cluster.create(name, replicas=0)
    pool = manifests.pool(POOL, NS, ("judge", "coder"), default="judge")
    await cluster.custom.create_namespaced_custom_object(GROUP, VERSION, NS, POOLS, pool)
    await sims()
    log_path = tmp_path / "reconciler.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "devstack.reconciler", "--kubeconfig",
             str(cluster.kubeconfig_for(USER)), "--namespace", NS, "--requeue", "300ms"],
            cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        await eventually(lambda: resident_is(cluster, "judge"), SWAP_TIMEOUT, "judge warmed")
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 15)
    assert proc.returncode == 0, log_path.read_text()
    assert "reconciler running: namespaces=['sim'] requeue=0.3s" in log_path.read_text()
    assert calls(cluster, USER, "patch", POOLS, "status")  # it wrote as its own user
