"""Answers that say why, through the real Envoy in both actuation modes: a request released
after a hold says how long it was held and which swap it waited for, our 503s carry the
predicted wait, and GET /pools/<namespace>/<name> shows the queue per member while it waits."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import aiohttp

from devstack.stack import LocalStack
from e2e_support import NAMESPACE, LOAD_DELAY, chat, eventually, pools, wait_resident

BOTH_MODES = True
STACK_DOCS = pools(("why", ["why-a", "why-b"], {"default": "why-a"}))


def _queue(stack: LocalStack) -> dict:
    """The pool's document at the stable endpoint (the ext_proc's metrics port)."""
    url = stack.debug_url.replace("/debug/pools", f"/pools/{NAMESPACE}/why")
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.headers["content-type"].startswith("application/json")
        return json.loads(resp.read())


async def test_a_released_request_says_how_long_it_was_held_and_for_which_swap(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    assert (await chat(http, stack, "why-a")).status == 200
    await wait_resident(stack, "why", "why-a")
    warm = await chat(http, stack, "why-a")
    # served at once: nothing to say
    assert warm.status == 200
    assert "x-modelpool-held-ms" not in warm.headers and "x-modelpool-swap" not in warm.headers
    moving = asyncio.create_task(chat(http, stack, "why-b"))

    def waiting() -> dict | None:
        doc = _queue(stack)
        return doc if doc["members"][1]["held"] == 1 else None
    doc = await eventually(waiting, what="the held request in the pool's queue")
    assert doc["apiVersion"] == "modelpool-extproc/v1" and doc["name"] == "why"
    b = doc["members"][1]
    assert b["name"] == "why-b" and not b["serving"] and b["predicted_wait_seconds"] > 0
    assert doc["members"][0]["serving"] or doc["swap"] == "why-a->why-b"
    released = await moving
    assert released.status == 200 and released.served_by == "why-b"
    held_ms = int(released.headers["x-modelpool-held-ms"])
    # held at least through the load, at most the whole answer
    assert LOAD_DELAY * 1000 * 0.5 <= held_ms <= released.took * 1000 + 50
    assert released.headers["x-modelpool-swap"] == "why-a->why-b"
    after = _queue(stack)
    assert after["resident"] == "why-b" and after["members"][1]["serving"]
    assert after["members"][1]["predicted_wait_seconds"] == 0


async def test_a_503_carries_the_predicted_wait(stack: LocalStack,
                                                http: aiohttp.ClientSession) -> None:
    assert (await chat(http, stack, "why-a")).status == 200
    await wait_resident(stack, "why", "why-a")
    reply = await chat(http, stack, "why-b", headers={"x-modelpool-max-wait": "1ms"})
    assert reply.status == 503 and reply.json()["error"]["code"] == "max_wait_exceeded"
    predicted = float(reply.headers["x-modelpool-predicted-wait"])
    assert predicted > 0.001 and int(reply.headers["retry-after"]) >= 1


async def test_the_endpoint_lists_every_pool_and_refuses_an_unknown_one(
        stack: LocalStack) -> None:
    base = stack.debug_url.replace("/debug/pools", "/pools")
    with urllib.request.urlopen(base, timeout=5) as resp:
        listing = json.loads(resp.read())
    assert [(p["namespace"], p["name"]) for p in listing["pools"]] == [(NAMESPACE, "why")]
    try:
        urllib.request.urlopen(f"{base}/{NAMESPACE}/nobody", timeout=5)
    except urllib.error.HTTPError as exc:
        assert exc.code == 404 and json.loads(exc.read())["error"]["code"] == "pool_not_found"
    else:
        raise AssertionError("an unknown pool must be a 404")
