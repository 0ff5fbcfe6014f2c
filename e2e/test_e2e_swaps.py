"""Swaps as a user sees them: cold start, a held cross-model request, coalescing, draining SSE.

One stack for the module; each test has its own pool (members are named after it), so tests
neither see each other's swaps nor need a reset.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

from devstack.stack import LocalStack
from e2e_support import (LOAD_DELAY, SWAP_BOUND, chat, eventually, extproc_calls, kubectl_shows,
                         notices, pools, timeline, wait_resident)

BOTH_MODES = True  # own actuation, and LLMKube's activator beside its reconciler
STACK_DOCS = pools(
    ("cold", ["cold-a", "cold-b"], {"default": "cold-a"}),
    ("cross", ["cross-a", "cross-b"], {"default": "cross-a"}),
    ("herd", ["herd-a", "herd-b"], {"default": "herd-a"}),
    ("drain", ["drain-a", "drain-b"], {"default": "drain-a"}),
)


async def test_cold_pool_warms_the_default_and_serves_it(stack: LocalStack,
                                                         http: aiohttp.ClientSession) -> None:
    # Nobody asked yet: the default member is warmed on its own (rule 2).
    await wait_resident(stack, "cold", "cold-a")
    await kubectl_shows(stack, "cold", "cold-a", "Ready")
    # Own mode: our swap warmed it. llmkube mode: LLMKube's reconciler warms the default on
    # its own, and may be done before this service first sees the pool (then no swap of ours).
    warmups = [(n["source"], n["target"]) for n in notices(stack, "cold")]
    assert warmups == [("", "cold-a")] or (stack.actuation == "llmkube" and warmups == [])
    assert timeline(stack, "cold-b", "pod_created") == []  # the other member never started

    reply = await chat(http, stack, "cold-a")
    assert reply.status == 200, reply.body
    assert reply.served_by == "cold-a"
    assert reply.json()["choices"][0]["message"]["content"].startswith("[cold-a]")
    # served warm: no second swap
    assert len(notices(stack, "cold")) == len(warmups)


async def test_cross_model_request_is_held_through_an_ordered_swap(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "cross", "cross-a")
    reply = await chat(http, stack, "cross-b")
    assert reply.status == 200, reply.body
    assert reply.served_by == "cross-b"
    assert reply.took >= LOAD_DELAY  # it was held while cross-b loaded
    await kubectl_shows(stack, "cross", "cross-b", "Ready")
    [swap] = [n for n in notices(stack, "cross") if n["target"] == "cross-b"]
    assert (swap["source"], swap["released"]) == ("cross-a", 1)

    # Unload before load (rule 4), from the simulator's clock: the incumbent's pod object
    # was gone before the target's pod was created.
    [gone] = timeline(stack, "cross-a", "pod_deleted")
    [created] = timeline(stack, "cross-b", "pod_created")
    assert gone["t"] < created["t"]
    # ... and from the API server's record: the ext_proc scaled cross-b up only after the
    # last request that removed cross-a's pod. (Spec and /scale writes to cross-b come from
    # the ext_proc alone: the simulator writes /status, and this test annotates nothing. The
    # leader's stamp, a metadata-only patch, is one of them but no scale.)
    def writes(r: dict) -> bool:
        return r["verb"] in ("patch", "update") and r["resource"] == "inferenceservices" \
            and r["name"] == "cross-b" and r["subresource"] in (None, "scale")

    def scales(r: dict) -> bool:
        return writes(r) and "spec" in (r.get("body") or {})
    assert any(scales(r) for r in extproc_calls(stack))
    if stack.actuation == "llmkube":
        # The activator triggers at once and LLMKube's reconciler holds the target at 0 until
        # the incumbent's pods are gone (the timeline above): our writes are triggers only.
        assert all(r["body"]["spec"] == {"replicas": 1} for r in extproc_calls(stack)
                   if scales(r))
        return
    record = stack.api_requests()
    # The simulator removes a terminating pod by dropping its finalizer (a spec patch; the
    # delete it sends afterwards finds nothing).
    removed = max(i for i, r in enumerate(record)
                  if r["resource"] == "pods" and r["verb"] == "patch" and not r["subresource"]
                  and (r["name"] or "").startswith("cross-a-"))
    # the full record has no bodies: pair its writes to cross-b with the ext_proc's, in order
    ours = [r for r in extproc_calls(stack) if writes(r)]
    where = [i for i, r in enumerate(record) if writes(r)]
    assert len(ours) == len(where)
    assert min(i for i, r in zip(where, ours) if scales(r)) > removed


async def test_concurrent_requests_for_one_member_share_one_swap(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "herd", "herd-a")
    replies = await asyncio.gather(*(chat(http, stack, "herd-b") for _ in range(20)))
    assert [r.status for r in replies] == [200] * 20
    assert {r.served_by for r in replies} == {"herd-b"}
    swaps = [n for n in notices(stack, "herd") if n["target"] == "herd-b"]
    assert len(swaps) == 1
    assert len(timeline(stack, "herd-b", "pod_created")) == 1  # loaded once
    assert swaps[0]["released"] == 20
    assert stack.metric("llmkube_modelpool_coalesced_total", pool="herd") == 19
    await kubectl_shows(stack, "herd", "herd-b", "Ready")


async def test_swap_waits_for_an_sse_stream_on_the_incumbent(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "drain", "drain-a")
    tokens = 30
    # ~3 s of tokens on the incumbent
    stream = asyncio.create_task(chat(http, stack, "drain-a", stream=True, tokens=tokens,
                                      token_delay_ms=100))
    await eventually(lambda: stack.metric("modelpool_extproc_requests_total", pool="drain",
                                          outcome="admitted") >= 1, what="the stream admitted")
    other = await chat(http, stack, "drain-b")
    sse = await stream

    assert sse.status == 200 and sse.served_by == "drain-a"
    chunks = [json.loads(e) for e in sse.events[:-1]]
    assert sse.events[-1] == "[DONE]"
    assert len(chunks) == tokens + 1  # every token, then the finish chunk
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

    assert other.status == 200 and other.served_by == "drain-b"
    # Drain before unload: the incumbent's pod began terminating only once the stream was
    # over (its last token cannot leave the member before `tokens` paced delays have passed),
    # and the cross-model request was answered after the stream.
    [terminating] = timeline(stack, "drain-a", "pod_terminating")
    assert terminating["t"] >= sse.began + tokens * 0.1
    assert other.ended > sse.ended
    assert other.ended - sse.ended < SWAP_BOUND
    await kubectl_shows(stack, "drain", "drain-b", "Ready")


def test_extproc_calls_are_recorded_under_their_own_user(stack: LocalStack) -> None:
    calls = extproc_calls(stack)
    status_writes = any(c["resource"] == "modelpools" and c["subresource"] == "status"
                        for c in calls)
    assert status_writes == (stack.actuation == "own")  # llmkube mode never writes status
    assert not any(c["resource"] == "pods" and c["verb"] == "create" for c in calls)
