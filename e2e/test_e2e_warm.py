"""Warm swaps end to end: through Envoy, the service and the member simulator,
which plays llama.cpp's slot API and a prefill cost per uncached prompt token.

* carry-over: a conversation that comes back after a -> b -> a reuses its prompt cache
  (llama.cpp's ``timings.cache_n`` of the returning turn), in both actuation modes; without
  the annotation it does not; a member whose server has no ``--slot-save-path`` fails open;
* paced release: requests held for a member with capacity 2 reach it at most 2 at once.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from devstack.stack_swaps import read_log
from devstack.fakemember_slots import PREFILL_ENV, SLOT_SAVE_PATH_ENV, SLOTS_ENV
from e2e_support import chat, eventually, pools, start_stack, wait_resident
from extproc.names import CAPACITY_ANNOTATION, CARRY_ANNOTATION

MEMBERS = ["warm-a", "warm-b"]
CONVERSATION = " ".join(f"w{i}" for i in range(400))


def _stack(tmp_path_factory, name: str, annotations: dict[str, str], **options):
    docs = pools((name, MEMBERS, {"default": "warm-a",
                                  "member_annotations": {m: annotations for m in MEMBERS}}))
    return start_stack(tmp_path_factory.mktemp(name), docs, **options)


def notices(stack, pool: str, kind: str) -> list[dict]:
    """The service's log entries of one carry-over notice kind for ``pool``."""
    return [e for e in read_log(stack.replica(0).log_path)
            if e.get("event") == kind and e.get("pool") == pool]


async def _turn(http: aiohttp.ClientSession, stack, model: str, text: str) -> dict:
    reply = await chat(http, stack, model, messages=[{"role": "user", "content": text}])
    assert reply.status == 200, reply.body
    return json.loads(reply.body)["timings"]


async def _a_b_a(http: aiohttp.ClientSession, stack, pool: str, tag: str) -> dict:
    """The conversation on warm-a, one request on warm-b, the conversation back on warm-a:
    the returning turn's timings."""
    conversation = f"{tag} {CONVERSATION}"
    first = await _turn(http, stack, "warm-a", conversation)
    assert first["cache_n"] == 0
    await _turn(http, stack, "warm-b", "elsewhere")
    return await _turn(http, stack, "warm-a", conversation + " once more")


@pytest.mark.parametrize("actuation", ["own", "llmkube"])
async def test_a_returning_conversation_reuses_its_prompt_cache(
        tmp_path_factory, monkeypatch: pytest.MonkeyPatch, actuation: str) -> None:
    monkeypatch.setenv(PREFILL_ENV, "1")
    monkeypatch.setenv(SLOTS_ENV, "1")
    stack = _stack(tmp_path_factory, f"carry-{actuation}", {CARRY_ANNOTATION: "true"},
                   actuation=actuation)
    try:
        async with aiohttp.ClientSession() as http:
            await wait_resident(stack, f"carry-{actuation}", "warm-a", timeout=30)
            back = await _a_b_a(http, stack, f"carry-{actuation}", "one")
            assert back["cache_n"] == 401 and back["prompt_n"] == 2  # only the new turn
            saved = sorted(p.name for p in (stack.log_dir / "members" / "slot-save").iterdir())
            assert saved == [f"e2e-{m}-{m}-model-slot0.bin" for m in MEMBERS]  # its modelRef
            pool = f"carry-{actuation}"
            carried = [n["msg"] for n in notices(stack, pool, "PromptCacheCarried")]
            assert any("warm-a: save done" in m for m in carried)
            assert any("warm-a: restore done (1 of 1 slots, 40" in m for m in carried)
            assert not notices(stack, pool, "PromptCacheCarryFailed")
            # without the annotation the conversation pays its prefill again
            for member in MEMBERS:
                stack.kubectl("annotate", "isvc", member, "-n", "e2e", f"{CARRY_ANNOTATION}-")
            await asyncio.sleep(1.0)  # the watch delivers it
            cold = await _a_b_a(http, stack, pool, "two")
            assert cold["cache_n"] == 0 and cold["prompt_n"] == 403
    finally:
        stack.stop()


async def test_carry_over_fails_open_without_a_slot_save_path(
        tmp_path_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOT_SAVE_PATH_ENV, "")  # llama-server without --slot-save-path
    stack = _stack(tmp_path_factory, "carry-fails", {CARRY_ANNOTATION: "true"})
    try:
        async with aiohttp.ClientSession() as http:
            await wait_resident(stack, "carry-fails", "warm-a", timeout=30)
            back = await _a_b_a(http, stack, "carry-fails", "three")
            assert back["cache_n"] == 0  # served, cold
        await eventually(lambda: notices(stack, "carry-fails", "PromptCacheCarryFailed"), 10)
        failed = [n["msg"] for n in notices(stack, "carry-fails", "PromptCacheCarryFailed")]
        assert any("save failed open" in m and "501" in m for m in failed), failed
    finally:
        stack.stop()


async def test_paced_release_lets_at_most_the_capacity_in(
        tmp_path_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOTS_ENV, "2")
    stack = _stack(tmp_path_factory, "paced", {CAPACITY_ANNOTATION: "2"},
                   extproc_args=["--paced-release"])
    stats = f"http://127.0.0.1:{stack.ports.members['warm-b']}/_upstream/stats"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_resident(stack, "paced", "warm-a", timeout=30)
            herd = [asyncio.create_task(chat(http, stack, "warm-b", stream=True, tokens=10,
                                             token_delay_ms=50)) for _ in range(6)]
            most, deadline = 0, time.monotonic() + 40
            while not all(t.done() for t in herd) and time.monotonic() < deadline:
                try:
                    async with http.get(stats, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                        most = max(most, (await resp.json())["in_flight"])
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass  # warm-b not up yet
                await asyncio.sleep(0.02)
            replies = await asyncio.gather(*herd)
        assert [r.status for r in replies] == [200] * 6
        assert most == 2  # paced: never more than its capacity, and it did take 2
    finally:
        stack.stop()
