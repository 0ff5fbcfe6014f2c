"""Beside LLMKube's ModelPool reconciler (the stand-in, devstack/reconciler.py), on one stack.

llmkube mode (this service is the pool's activator): its writes, read from the emulator's
request record, are only 0 -> 1 triggers of members that were not resident, and never a
status write or a scale-down; a request for the incumbent that arrives after the trigger is
held, never routed to the incumbent, even while the reconciler defers the unload because the
incumbent is busy (busy as another router's traffic makes it: a stream straight to the
member). The reconciler's deferral shows in our notices.
"""

from __future__ import annotations

import asyncio

import aiohttp

from devstack import testkit
from devstack.stack import LocalStack
from e2e_support import chat, eventually, extproc_calls, notices, pools, status, wait_resident

STACK_OPTIONS = {"actuation": "llmkube"}
STACK_DOCS = pools(
    ("rec", ["rec-a", "rec-b"], {"default": "rec-a"}),
    ("busy", ["busy-a", "busy-b"], {"default": "busy-a"}),
)


async def test_the_activator_only_triggers_non_resident_members(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "rec", "rec-a", timeout=30)
    for member in ("rec-b", "rec-a", "rec-b"):
        reply = await chat(http, stack, member)
        assert (reply.status, reply.served_by) == (200, member), reply.body
    calls = [c for c in extproc_calls(stack) if (c.get("name") or "").startswith("rec")
             or c["resource"] == "modelpools"]
    writes = [c for c in calls if c["verb"] in ("patch", "update", "create", "delete")]
    assert not [c for c in writes if c["resource"] == "modelpools"], writes  # no status write
    patches = [c for c in writes if c["resource"] == "inferenceservices"]
    assert patches, "the activator triggered nothing"
    for call in patches:
        body = call["body"]
        # replicas 1 and nothing else, guarded by the resourceVersion it read
        assert body["spec"] == {"replicas": 1} and set(body) == {"spec", "metadata"}, body
        assert set(body["metadata"]) == {"resourceVersion"}, body
    started = [n["target"] for n in notices(stack, "rec", "SwapStarted")
               if "by LLMKube" not in n["msg"]]
    assert [c["name"] for c in patches] == started  # one trigger per swap we started
    assert status(stack, "rec")["residentMember"] == "rec-b"


async def test_a_request_for_the_incumbent_after_the_trigger_is_held(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "busy", "busy-a", timeout=30)
    # another router's stream on the incumbent: our count is 0, LLMKube's probe says busy
    direct = f"http://127.0.0.1:{stack.ports.members['busy-a']}"
    async with aiohttp.ClientSession() as other_router:
        stream = asyncio.create_task(testkit.chat(other_router, direct, "busy-a", stream=True,
                                                  tokens=30, token_delay_ms=100))
        await asyncio.sleep(0.3)
        target = asyncio.create_task(chat(http, stack, "busy-b"))
        await eventually(lambda: status(stack, "busy").get("pendingMember") == "busy-b",
                         10, "the trigger seen by the reconciler")
        incumbent = asyncio.create_task(chat(http, stack, "busy-a"))
        streamed = await stream
        b_reply, a_reply = await target, await incumbent
    assert streamed.status == 200
    assert (b_reply.status, b_reply.served_by) == (200, "busy-b"), b_reply.body
    # held, not routed: answered only after the swap to busy-b (and its way back) were done
    assert a_reply.status == 200 and a_reply.served_by == "busy-a", a_reply.body
    assert a_reply.ended > b_reply.ended
    assert a_reply.ended > streamed.ended
    deferred = [n for n in notices(stack, "busy", "SwapDeferred") if n["source"] == "PodsBusy"]
    assert deferred, "the reconciler's PodsBusy deferral is not in our notices"
