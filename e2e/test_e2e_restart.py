"""The ext_proc killed (SIGKILL) in the middle of a swap and started again.

The swap is recorded in Kubernetes (member replicas, the pool's status), not only in the
process, so a fresh process must pick it up: finish it, report the right status, and serve.
Two moments: while the incumbent unloads (the target is not scaled up yet, only the pool's
pendingMember says where the slot was going) and while the target loads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from devstack.stack import LocalStack
from e2e_support import (chat, eventually, kubectl_shows, notices, pods_of, pools, status, timeline,
                         wait_resident)

LOAD = "sim.llmkube.dev/load-delay"
UNLOAD = "sim.llmkube.dev/unload-delay"
BOTH_MODES = True  # own actuation, and LLMKube's activator beside its reconciler
STACK_DOCS = pools(
    ("unloading", ["unl-a", "unl-b"],
     {"default": "unl-a", "member_annotations": {"unl-a": {UNLOAD: "3s"}}}),
    ("loading", ["lod-a", "lod-b"],
     {"default": "lod-a", "member_annotations": {"lod-b": {LOAD: "3s"}}}),
    ("steady", ["std-a", "std-b"], {"default": "std-a"}),
)


async def swap_held_until(stack: LocalStack, http: aiohttp.ClientSession, pool: str, old: str,
                          new: str, moment: Callable[[], object], what: str) -> asyncio.Task:
    """With ``old`` resident, hold a request for ``new``; return it once ``moment()`` holds."""
    await wait_resident(stack, pool, old)
    held = asyncio.create_task(chat(http, stack, new))
    await eventually(moment, what=what)
    return held


async def crash_and_restart(stack: LocalStack, held: asyncio.Task) -> None:
    """SIGKILL the ext_proc, check what its held client got, start a new one."""
    await asyncio.to_thread(stack.kill_extproc)
    reply = await held
    # Envoy fails open safely: the stream broke before a routing decision, so the request
    # takes the no-routing-header route (503 + Retry-After), never a member.
    assert reply.status == 503, reply.body
    assert reply.json()["error"]["code"] == "router_unavailable"
    assert "retry-after" in reply.headers
    await asyncio.to_thread(stack.start_extproc)


async def finished_and_serving(stack: LocalStack, http: aiohttp.ClientSession, pool: str,
                               old: str, new: str) -> None:
    """The swap old -> new is complete, reported, single-resident, and new serves."""
    await wait_resident(stack, pool, new, timeout=30)
    await kubectl_shows(stack, pool, new, "Ready")
    st = status(stack, pool)
    assert st.get("pendingMember", "") == ""  # (LLMKube leaves an empty one out)
    # (and a false `resident`, as Go's omitempty does)
    assert {m["name"]: m.get("resident", False) for m in st["members"]} == \
        {old: False, new: True}
    assert stack.isvc(old)["spec"]["replicas"] == 0
    assert await asyncio.to_thread(pods_of, stack, old) == []
    assert len(await asyncio.to_thread(pods_of, stack, new)) == 1
    # never two members at once, across both processes
    [gone] = timeline(stack, old, "pod_deleted")
    [created] = timeline(stack, new, "pod_created")
    assert gone["t"] < created["t"]
    reply = await chat(http, stack, new)
    assert (reply.status, reply.served_by) == (200, new)


async def test_killed_while_the_incumbent_unloads(stack: LocalStack,
                                                  http: aiohttp.ClientSession) -> None:
    held = await swap_held_until(stack, http, "unloading", "unl-a", "unl-b",
                                 lambda: timeline(stack, "unl-a", "pod_terminating"),
                                 "unl-a to start unloading")
    await eventually(lambda: status(stack, "unloading").get("pendingMember") == "unl-b",
                     what="the pool status to name the pending member")
    await crash_and_restart(stack, held)
    await finished_and_serving(stack, http, "unloading", "unl-a", "unl-b")


async def test_killed_while_the_target_loads(stack: LocalStack,
                                             http: aiohttp.ClientSession) -> None:
    held = await swap_held_until(stack, http, "loading", "lod-a", "lod-b",
                                 lambda: timeline(stack, "lod-b", "pod_created"),
                                 "lod-b to start loading")
    await crash_and_restart(stack, held)
    await finished_and_serving(stack, http, "loading", "lod-a", "lod-b")
    assert len(timeline(stack, "lod-b", "pod_created")) == 1  # the load was not restarted
    # the new process reports the completion it saw (its SwapStarted resumed the swap)
    assert any(n["target"] == "lod-b" for n in notices(stack, "loading"))


async def test_graceful_restart_of_a_settled_pool_moves_nothing(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "steady", "std-a")
    assert (await chat(http, stack, "std-b")).served_by == "std-b"  # sticky now on std-b
    started = len(notices(stack, "steady", "SwapStarted"))
    await asyncio.to_thread(stack.restart_extproc)
    # The new process adopts the Ready resident: no warm-up of the default, no swap.
    reply = await chat(http, stack, "std-b")
    assert (reply.status, reply.served_by) == (200, "std-b")
    assert len(notices(stack, "steady", "SwapStarted")) == started
    assert len(timeline(stack, "std-b", "pod_created")) == 1
    assert len(timeline(stack, "std-a", "pod_created")) == 1  # the default was not re-warmed
    await kubectl_shows(stack, "steady", "std-b", "Ready")
