"""What the LLMKube stand-in's tests share: the `llmkube` fixture and readers of the API's record.

The tests play LLMKube's activator: they only scale a member 0 -> 1, as the router-proxy (or
the ext_proc in llmkube mode) does. With ``simulate=False`` no member simulator runs and the
test writes the members' statuses and pods itself, playing LLMKube's InferenceService
controller exactly, so a case the simulator would not hold still stays put.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Callable, NamedTuple

import pytest
from kubernetes.aio import watch

from devstack import stack_manifests as manifests
from devstack.proberouter import ProbeRouter
from devstack.procs import free_port
from devstack.reconciler import POOLS, USER, ModelPoolReconciler
from devstack.simulator import MemberSimulator
from devstack.simulator_kube import GROUP, MERGE_PATCH, PLURAL, VERSION
from devstack.testkit import finish_within
from devstack_cluster import NS, Cluster, eventually

POOL = "gpu"
REQUEUE = 0.3  # LLMKube's 3 s, shortened so a test's swaps take a second, not ten
IDLE_TIMEOUT = 0.3
# A Deployment's hops before a pod exists: the window in which an early trigger must be held.
ROLLOUT = 0.3
SWAP_TIMEOUT = 15.0


class Stack(NamedTuple):
    """What the `llmkube` fixture started."""

    sim: MemberSimulator | None  # None with simulate=False
    reconciler: ModelPoolReconciler
    router: ProbeRouter  # the members' cluster DNS names, for the idle probe


@pytest.fixture
async def llmkube(cluster: Cluster, sims) -> AsyncIterator[Callable[..., Awaitable[Stack]]]:
    """Create members and the pool, then start the simulator (unless not) and the stand-in."""
    started: list[ModelPoolReconciler] = []
    routers: list[ProbeRouter] = []

    async def start(members: tuple[str, ...] = ("judge", "coder"), default: str = "judge",
                    pool_members: tuple[str, ...] | None = None, simulate: bool = True,
                    **options: Any) -> Stack:
        for name in members:
            await cluster.create(name, replicas=0)
        pool = manifests.pool(POOL, NS, pool_members or members, default=default)
        await cluster.custom.create_namespaced_custom_object(GROUP, VERSION, NS, POOLS, pool)
        ports = {m: free_port() for m in pool_members or members}
        router = ProbeRouter(free_port(), {f"{NS}/{m}": p for m, p in ports.items()})
        await router.start()
        routers.append(router)
        sim = await sims(ports, rollout_delay=ROLLOUT) if simulate else None
        reconciler = ModelPoolReconciler(cluster.kubeconfig_for(USER), [NS], requeue=REQUEUE,
                                         idle_timeout=IDLE_TIMEOUT, probe_proxy=router.url,
                                         **options)
        started.append(reconciler)
        await reconciler.start()
        return Stack(sim, reconciler, router)

    try:
        yield start
    finally:
        for n, reconciler in enumerate(started):
            await finish_within(reconciler.stop(), 30,
                                f"reconciler #{n} to stop (its watches, pool workers, session)")
        for router in routers:
            await router.stop()


async def warm(cluster: Cluster, llmkube, **options: Any) -> Stack:
    """A pool whose default, judge, is resident and Ready."""
    stack = await llmkube(**options)
    await eventually(lambda: resident_is(cluster, "judge"), SWAP_TIMEOUT, "judge warmed")
    return stack


# ---- reading the pool ----------------------------------------------------------------------


async def pool_status(cluster: Cluster) -> dict[str, Any]:
    """The pool's status as the API holds it."""
    pool = await cluster.custom.get_namespaced_custom_object(GROUP, VERSION, NS, POOLS, POOL)
    return pool.get("status") or {}


def condition(status: dict[str, Any], kind: str) -> tuple[str, str] | None:
    """(status, reason) of one condition, None when absent."""
    found = [c for c in status.get("conditions") or [] if c["type"] == kind]
    return (found[0]["status"], found[0]["reason"]) if found else None


def message(status: dict[str, Any], kind: str) -> str | None:
    """The message of one condition, None when absent."""
    found = [c for c in status.get("conditions") or [] if c["type"] == kind]
    return found[0]["message"] if found else None


async def resident_is(cluster: Cluster, member: str) -> dict[str, Any] | None:
    """The pool's status once `member` is resident, the pool Ready and nothing pending."""
    status = await pool_status(cluster)
    done = status.get("residentMember") == member and status.get("phase") == "Ready" \
        and not status.get("pendingMember")
    return status if done else None


async def pending_is(cluster: Cluster, member: str) -> dict[str, Any] | None:
    """The pool's status once `member` is pending."""
    status = await pool_status(cluster)
    return status if status.get("pendingMember") == member else None


async def deferred_by(cluster: Cluster, reason: str) -> dict[str, Any] | None:
    """The pool's status once SwapDeferred is True for `reason`."""
    status = await pool_status(cluster)
    return status if condition(status, "SwapDeferred") == ("True", reason) else None


async def phase_is(cluster: Cluster, phase: str) -> dict[str, Any] | None:
    """The pool's status once its phase is `phase`."""
    status = await pool_status(cluster)
    return status if status.get("phase") == phase else None


async def replicas(cluster: Cluster, member: str) -> int:
    """A member's spec.replicas."""
    return (await cluster.isvc(member))["spec"]["replicas"]


async def replicas_are(cluster: Cluster, member: str, value: int) -> bool:
    """True once the member's spec.replicas is `value`."""
    return await replicas(cluster, member) == value


# ---- the emulator's record -----------------------------------------------------------------


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


async def pool_history(cluster: Cluster, since: str) -> list[dict[str, Any]]:
    """The pool's status after each change of it, in order."""
    return [obj.get("status") or {} for _, obj in await history(
        cluster, cluster.custom.list_namespaced_custom_object, GROUP, VERSION, NS, POOLS,
        since=since)]


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


def status_patches(cluster: Cluster) -> list[dict[str, Any]]:
    """The ``status`` of every pool status patch the stand-in sent, oldest first."""
    return [body["status"] for caller, entry, body in cluster.emu.handler.callers
            if caller == USER and entry.verb == "patch" and entry.resource == POOLS
            and entry.subresource == "status"]


# ---- playing LLMKube's InferenceService controller (simulate=False) ------------------------


async def report(cluster: Cluster, member: str, phase: str, ready: int = 0) -> None:
    """Write a member's status as LLMKube's InferenceService controller would."""
    await cluster.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, member,
        {"status": {"phase": phase, "readyReplicas": ready}}, _content_type=MERGE_PATCH)


async def make_pod(cluster: Cluster, name: str, labels: dict[str, str]) -> None:
    """A pod with these labels (a member's, or one that only looks like it)."""
    await cluster.core.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "llm", "image": "devstack/fake-llm:latest"}]}})


async def poke(cluster: Cluster, value: str) -> None:
    """Touch the pool (an annotation) so the stand-in runs a pass; nothing it reads changes."""
    await cluster.custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, POOLS, POOL, {"metadata": {"annotations": {"test/poke": value}}},
        _content_type=MERGE_PATCH)


async def passes_after(reconciler: ModelPoolReconciler, count: int,
                       start: int | None = None) -> int:
    """Wait until the stand-in has run `count` more passes than `start` (default: now)."""
    start = reconciler.passes if start is None else start
    return await eventually(lambda: _more(reconciler, start + count), SWAP_TIMEOUT,
                            f"{count} more passes")


async def _more(reconciler: ModelPoolReconciler, target: int) -> int | None:
    return reconciler.passes if reconciler.passes >= target else None
