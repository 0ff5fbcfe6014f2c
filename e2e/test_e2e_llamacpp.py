"""Real members: llama.cpp's own llama-server in the loop, in both actuation modes.

The member simulator starts the real server (``make llama-server``, built from the pinned
llama-cpp-python sdist) on generated models (devstack/tinymodel.py) instead of the fake
upstream; everything else is the usual stack: the API emulator, the ext_proc, Envoy.

* swaps under load with the real server's own load and unload;
* a long real generation on the resident is never cut by a swap, the idle probe (llama.cpp's
  ``/slots``) holding the drain while it runs;
* prompt-cache carry-over across a -> b -> a, read off llama.cpp's own ``timings.cache_n``,
  and a save that fails (the slot directory gone) failing open;
* paced release at the real server's ``-np`` (read from its ``/slots``);
* a member whose model file is corrupt fails to load (llama.cpp exits) and ends ``Failed``;
  the pool serves on (own mode) or says it is blocked by it (llmkube mode: LLMKube's
  reconciler keeps a failed member pending);
* streamed answers relayed whole through Envoy.
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp

from devstack import llamacpp, tinymodel
from devstack.stack import LLAMA_MODELS
from devstack.stack_swaps import read_log
from e2e_support import (NAMESPACE, chat, eventually, pools, require_llama_server, status, timeline,
                         wait_resident)
from extproc.platform.kube.idle.slotcache import slot_file
from extproc.names import CARRY_ANNOTATION

BOTH_MODES = True
LARGE = str(LLAMA_MODELS / "large.gguf")
CORRUPT = str(LLAMA_MODELS / "corrupt.gguf")
CARRY = {CARRY_ANNOTATION: "true"}


def _models() -> None:
    """The binary (or a skip saying how to build it; a failure under CI) and the models."""
    require_llama_server()
    tinymodel.ensure(LLAMA_MODELS, "large")
    if not os.path.exists(CORRUPT):
        with open(CORRUPT, "wb") as f:  # a GGUF magic and then nonsense
            f.write(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)


_models()
STACK_DOCS = pools(
    ("real", ["real-a", "real-b"], {"default": "real-a",
                                   "member_annotations": {"real-a": CARRY, "real-b": CARRY}}),
    ("long", ["long-a", "long-b"], {"default": "long-a", "member_annotations": {
        "long-a": {llamacpp.ANN_MODEL_FILE: LARGE}}}),
    ("paced", ["paced-a", "paced-b"], {"default": "paced-a", "member_annotations": {
        "paced-b": {llamacpp.ANN_PARALLEL: "2"}}}),
    ("broken", ["broken-a", "broken-b"], {"default": "broken-a", "member_annotations": {
        "broken-b": {llamacpp.ANN_MODEL_FILE: CORRUPT}}}),
)
STACK_OPTIONS = {"runtime": "llama.cpp", "load_delay": 0.0,
                 "extproc_args": ["--idle-gate", "--paced-release"]}


def answered_by(reply) -> str:
    """The member that answered: llama-server names its --alias (the member) as the model."""
    if reply.events:
        return json.loads(reply.events[0])["model"]
    return reply.json()["model"]


async def _resident_a(stack, http: aiohttp.ClientSession) -> None:
    """The "real" pool with real-a resident, whichever test left it otherwise."""
    if status(stack, "real").get("residentMember") != "real-a":
        reply = await chat(http, stack, "real-a", timeout=120)
        assert reply.status == 200, reply.body
    await wait_resident(stack, "real", "real-a", timeout=60)


async def test_swaps_under_load_with_real_loads_and_unloads(stack, http: aiohttp.ClientSession) -> None:
    await _resident_a(stack, http)
    wave = [asyncio.create_task(chat(http, stack, member, tokens=16))
            for member in ["real-b", "real-a"] * 4]
    replies = await asyncio.gather(*wave)
    assert [r.status for r in replies] == [200] * 8, [r.body for r in replies]
    assert [answered_by(r) for r in replies] == ["real-b", "real-a"] * 4
    back = await chat(http, stack, "real-a")  # and back: b's real server stops for a
    assert (back.status, answered_by(back)) == (200, "real-a")
    assert timeline(stack, "real-b", "server_started")
    await eventually(lambda: timeline(stack, "real-b", "server_stopped"), 30, "b stopped")


async def test_a_long_generation_is_never_cut(stack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "long", "long-a", timeout=60)
    # (ignore_eos: random weights may well sample the end of text early)
    long = asyncio.create_task(chat(http, stack, "long-a", tokens=60, timeout=120,
                                    ignore_eos=True))
    slots = f"http://127.0.0.1:{stack.ports.members['long-a']}/slots"

    async def generating() -> bool:
        async with http.get(slots) as resp:
            return any(s["is_processing"] for s in await resp.json())
    await eventually_async(generating, 30)
    other = await chat(http, stack, "long-b", timeout=120)
    finished = await long
    assert finished.status == 200, finished.body
    usage = finished.json()["usage"]
    assert usage["completion_tokens"] == 60  # whole: the swap waited for it
    assert (other.status, answered_by(other)) == (200, "long-b")
    stopped = timeline(stack, "long-a", "server_stopped")
    assert stopped and other.ended >= finished.ended  # b answered only once a finished


async def eventually_async(check, timeout: float) -> None:
    """Poll an async ``check`` until it is truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_prompt_cache_carries_over_a_b_a(stack, http: aiohttp.ClientSession) -> None:
    await _resident_a(stack, http)
    conversation = [{"role": "user", "content": "tell me about " + " ".join(
        f"topic{i}" for i in range(40))}]
    first = await chat(http, stack, "real-a", messages=conversation, tokens=4)
    assert first.status == 200, first.body
    await chat(http, stack, "real-b", tokens=4)
    await wait_resident(stack, "real", "real-b", timeout=60)
    back = await chat(http, stack, "real-a", messages=conversation, tokens=4)
    assert back.status == 200 and answered_by(back) == "real-a", back.body
    timings = back.json()["timings"]
    prompt = first.json()["timings"]["prompt_n"]
    # a new llama-server process, yet the prompt came back cached: restored from the slot file
    assert timings["cache_n"] >= prompt - 1 and timings["prompt_n"] <= 2, timings


async def test_a_slot_save_that_fails_opens_the_swap_and_the_target_serves(
        stack, http: aiohttp.ClientSession) -> None:
    # The save files' places are taken by directories, so llama.cpp's own save fails (as
    # root, permissions would not stop it; a missing --slot-save-path stops the server from
    # starting): the carry fails open and the swap goes on.
    await _resident_a(stack, http)
    slot_dir = stack.log_dir / "members" / "slot-save"
    blocked = [slot_dir / slot_file(NAMESPACE, "real-a", "real-a-model", slot)
               for slot in range(llamacpp.DEFAULT_PARALLEL)]
    for path in blocked:
        path.unlink(missing_ok=True)
        path.mkdir()
    try:
        reply = await chat(http, stack, "real-b", timeout=120)
    finally:
        for path in blocked:
            path.rmdir()
    assert (reply.status, answered_by(reply)) == (200, "real-b"), reply.body
    failed = [e for e in read_log(stack.replica(0).log_path)
              if e.get("event") == "PromptCacheCarryFailed" and e.get("source") == "real-a"]
    assert failed and "save failed open" in failed[-1]["msg"], failed


async def test_paced_release_at_the_real_slot_count(stack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "paced", "paced-a", timeout=60)
    herd = [asyncio.create_task(chat(http, stack, "paced-b", stream=True, tokens=32))
            for _ in range(5)]
    replies = await asyncio.gather(*herd)
    assert [r.status for r in replies] == [200] * 5, [(r.status, r.headers, r.body)
                                                      for r in replies]
    assert all(answered_by(r) == "paced-b" for r in replies)
    # paced at 2: the ext_proc learnt -np 2 from the real /slots
    counted = [e for e in read_log(stack.replica(0).log_path)
               if e.get("msg") == "member slot count read" and e.get("member") == "paced-b"]
    assert counted and counted[-1]["slots"] == 2, counted


async def test_paced_streams_survive_llama_cpp_closing_each_connection(
        stack, http: aiohttp.ClientSession) -> None:
    # llama-server closes its connection after every streamed answer while saying keep-alive,
    # and paced release lets the next request go the moment a stream ends: onto a connection
    # Envoy may not yet know is closing. The virtual host's retry policy sends that one again
    # (never answered 503 "connection_termination").
    first = await chat(http, stack, "paced-b", timeout=120)  # (a swap to b if a is resident)
    assert first.status == 200, first.body
    herd = [asyncio.create_task(chat(http, stack, "paced-b", stream=True, tokens=4))
            for _ in range(24)]
    replies = await asyncio.gather(*herd)
    assert [r.status for r in replies] == [200] * 24, [r.body for r in replies if r.status != 200]


async def test_a_corrupt_model_ends_failed_and_the_pool_serves_on(
        stack, http: aiohttp.ClientSession, actuation: str) -> None:
    await wait_resident(stack, "broken", "broken-a", timeout=60)
    refused = await chat(http, stack, "broken-b", timeout=120)
    assert refused.status == 503, refused.body
    # Failed may last only until the service scales the member back down (own mode), so
    # the simulator's record of the failed load is what is read, not the phase right now
    await eventually(lambda: timeline(stack, "broken-b", "failed"), 60, "broken-b's load to fail")
    log = (stack.log_dir / "members" / "llama-broken-b.log").read_text()
    assert "failed to load model" in log  # llama.cpp's own failure
    served = await chat(http, stack, "broken-a", timeout=120)
    if actuation == "llmkube":
        # LLMKube's reconciler keeps a failed member pending and loads nothing else: the
        # answer says so and what to do (docs/design/llmkube.md), instead of holding every request
        assert served.status == 503 and served.json()["error"]["code"] == "pool_blocked"
        assert "broken-b" in served.json()["error"]["message"]
        return
    assert served.status == 200, served.body
    assert answered_by(served) == "broken-a"


async def test_streamed_answers_are_relayed_whole(stack, http: aiohttp.ClientSession) -> None:
    await _resident_a(stack, http)
    reply = await chat(http, stack, "real-a", stream=True, tokens=48, ignore_eos=True)
    assert reply.status == 200
    assert reply.events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in reply.events[:-1]]
    finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    assert finish[-1] == "length"
    assert chunks[-1]["timings"]["predicted_n"] == 48  # every token generated reached us
