"""Helpers of the fault suite: emulator fault switches, client outcomes, the invariant gate."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import aiohttp

from devstack.stack import LocalStack
from e2e_support import chat, eventually
from invariants import (ApiEvent, ApiRecorder, Outcome, exclusive_slot, misroutes,
                        upstream_failures)


def emulator(stack: LocalStack, action: str, body: dict[str, Any] | None = None) -> Any:
    """POST to one of the emulator's /_emulator/ switches (unavailable, compact, faults/...)."""
    request = urllib.request.Request(f"{stack.kubeapi_url}/_emulator/{action}", method="POST",
                                     data=json.dumps(body or {}).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def pool_members(stack: LocalStack) -> dict[tuple[str, str], list[str]]:
    """(namespace, pool) -> member names, from the stack's manifests."""
    return {(d["metadata"]["namespace"], d["metadata"]["name"]):
            [m["inferenceServiceRef"]["name"] for m in d["spec"]["members"]]
            for d in stack.docs if d["kind"] == "ModelPool"}


async def attempt(session: aiohttp.ClientSession, stack: LocalStack, model: str,
                  **kwargs: Any) -> Outcome:
    """One chat request as an Outcome; a broken connection is an outcome too, not an error."""
    try:
        reply = await chat(session, stack, model, **kwargs)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return Outcome(model, error=repr(exc))
    outcome = Outcome(model, reply.status, reply.served_by)
    if reply.status == 200 and not reply.events:
        text = reply.json()["choices"][0]["message"]["content"]
        outcome.body_member = text[1:text.index("]")] if text.startswith("[") else "?"
    elif reply.status != 200:
        try:
            outcome.code = reply.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            pass  # no OpenAI-style body: misroutes() reports it
    return outcome


async def at_rest(stack: LocalStack, timeout: float = 20.0) -> None:
    """Wait until no request is held and no ext_proc stream is open."""
    def idle() -> bool:
        return stack.metric("llmkube_modelpool_held_requests") == 0 and \
            stack.metric("modelpool_extproc_streams_in_flight") == 0
    await eventually(idle, timeout, "held requests and open streams to drop to zero")


def violations(stack: LocalStack, events: list[ApiEvent], outcomes: list[Outcome] = (),
               excused: dict[str, list[float]] | None = None,
               allow_broken: bool = False) -> list[str]:
    """Every invariant breach found in the API history, Envoy's access log and the outcomes."""
    assert stack.envoy is not None
    return exclusive_slot(events, pool_members(stack)) + \
        upstream_failures(stack.envoy.access_log(), excused) + \
        misroutes(outcomes, allow_broken)



async def violations_at_rest(stack: LocalStack, recorder: ApiRecorder, outcomes: list[Outcome],
                             **options: Any) -> list[str]:
    """``violations`` once the stack is at rest, so the history is complete when it is read."""
    await at_rest(stack)
    return violations(stack, recorder.ordered(), outcomes, **options)

async def trickle(stack: LocalStack, model: str, *, pause: float, pieces: int = 10,
                  stall: bool = False) -> Outcome:
    """A slow client: the body in ``pieces`` writes ``pause`` s apart; with ``stall`` it stops
    halfway and hangs up."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "slow"}]}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    assert stack.envoy is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", stack.envoy.listen_port)
    try:
        writer.write(head)
        step = -(-len(body) // pieces)
        for i in range(0, len(body), step):
            if stall and i >= len(body) // 2:
                return Outcome(model, gave_up=True)
            writer.write(body[i:i + step])
            await writer.drain()
            await asyncio.sleep(pause)
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head_text, _, payload = raw.partition(b"\r\n\r\n")
    lines = head_text.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    outcome = Outcome(model, int(lines[0].split()[1]), headers.get("x-served-by", ""))
    if outcome.status == 200:
        text = json.loads(payload)["choices"][0]["message"]["content"]
        outcome.body_member = text[1:text.index("]")]
    return outcome
