"""The fake member's llama.cpp slot API and prompt cache (devstack/fakemember_slots.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest

from devstack.fakemember import UpstreamHandle, start_upstream
from devstack.fakemember_slots import PREFILL_ENV, RESTORE_EFFECT_ENV, SLOT_SAVE_PATH_ENV

PROMPT = " ".join(f"w{i}" for i in range(200))
PER_TOKEN_MS = 2.0


@pytest.fixture
def slot_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A member configured like llama-server --slot-save-path DIR, with a prefill cost."""
    monkeypatch.setenv(SLOT_SAVE_PATH_ENV, str(tmp_path))
    monkeypatch.setenv(PREFILL_ENV, str(PER_TOKEN_MS))
    return tmp_path


@contextlib.asynccontextmanager
async def _judge(slots: int) -> AsyncIterator[tuple[UpstreamHandle, aiohttp.ClientSession]]:
    """A fake member `judge` with `slots` slots and no token delay, and a client session to it;
    the member stops on the way out (a test that starts a second one plays its pod's restart)."""
    member = await start_upstream("judge", token_delay_ms=0, slots=slots)
    try:
        async with aiohttp.ClientSession() as http:
            yield member, http
    finally:
        await member.stop()


async def _complete(http: aiohttp.ClientSession, url: str, prompt: str, **extra) -> dict:
    async with http.post(f"{url}/v1/completions",
                         json={"prompt": prompt, "max_tokens": 2, **extra}) as resp:
        assert resp.status == 200
        return await resp.json()


async def _slot(http: aiohttp.ClientSession, url: str, slot: int, action: str,
                filename: str | None = None) -> tuple[int, dict]:
    body = {} if filename is None else {"filename": filename}
    async with http.post(f"{url}/slots/{slot}?action={action}", json=body) as resp:
        return resp.status, await resp.json()


async def test_prompt_cache_reuse_and_prefill_cost(slot_env: Path) -> None:
    async with _judge(slots=2) as (member, http):
        first = await _complete(http, member.url, PROMPT)
        assert first["timings"]["cache_n"] == 0 and first["timings"]["prompt_n"] == 200
        assert first["timings"]["prompt_ms"] == pytest.approx(200 * PER_TOKEN_MS)
        again = await _complete(http, member.url, PROMPT + " more words")
        # the slot's cache is the first prompt plus its answer: the prompt is reused
        assert again["timings"]["cache_n"] == 200 and again["timings"]["prompt_n"] == 2
        async with http.get(f"{member.url}/slots") as resp:
            slots = await resp.json()
        assert [s["id"] for s in slots] == [0, 1]
        assert not any(s["is_processing"] for s in slots)


async def test_save_then_restore_in_a_new_process_reuses_the_prompt(slot_env: Path) -> None:
    async with _judge(slots=1) as (member, http):
        await _complete(http, member.url, PROMPT)
        status, saved = await _slot(http, member.url, 0, "save", "judge-m-0.bin")
    assert status == 200
    assert saved["id_slot"] == 0 and saved["filename"] == "judge-m-0.bin"
    assert saved["n_saved"] == 202 and saved["n_written"] == (slot_env / "judge-m-0.bin").stat().st_size
    assert "save_ms" in saved["timings"]
    async with _judge(slots=1) as (member, http):  # the pod after a swap
        status, restored = await _slot(http, member.url, 0, "restore", "judge-m-0.bin")
        assert status == 200
        assert restored["n_restored"] == 202 and restored["n_read"] == saved["n_written"]
        assert "restore_ms" in restored["timings"]
        warm = await _complete(http, member.url, PROMPT + " next")
        assert warm["timings"]["cache_n"] == 200 and warm["timings"]["prompt_n"] == 1
        status, erased = await _slot(http, member.url, 0, "erase")
        assert status == 200 and erased == {"id_slot": 0, "n_erased": 203}


async def test_restore_without_effect_reports_tokens_but_reuses_none(
        slot_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (slot_env / "s.bin").write_text('{"tokens": ["a", "b", "c"]}')
    monkeypatch.setenv(RESTORE_EFFECT_ENV, "none")  # sliding-window attention (#25913)
    async with _judge(slots=1) as (member, http):
        status, restored = await _slot(http, member.url, 0, "restore", "s.bin")
        assert status == 200 and restored["n_restored"] == 3
        cold = await _complete(http, member.url, "a b c d")
        assert cold["timings"]["cache_n"] == 0 and cold["timings"]["prompt_n"] == 4


async def test_slot_api_errors(slot_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with _judge(slots=1) as (member, http):
        for name in ("../x", ".hidden", "", "a/b", "trailing."):
            status, body = await _slot(http, member.url, 0, "save", name)
            assert status == 400 and body["error"]["message"] == "Invalid filename"
        status, body = await _slot(http, member.url, 0, "restore", "absent.bin")
        assert status == 400 and body["error"]["type"] == "invalid_request_error"
        status, body = await _slot(http, member.url, 7, "save", "x.bin")
        assert status == 400
        status, body = await _slot(http, member.url, 0, "compact", "x.bin")
        assert status == 400
    monkeypatch.delenv(SLOT_SAVE_PATH_ENV)
    async with _judge(slots=1) as (member, http):
        status, body = await _slot(http, member.url, 0, "save", "x.bin")
        assert status == 501 and body["error"]["type"] == "not_supported_error"


async def test_requests_wait_for_a_free_slot(slot_env: Path) -> None:
    async with _judge(slots=2) as (member, http):
        # three 200-token prompts on two slots: the third waits for a slot to free
        # (observed through /slots while they run, not through timing)
        tasks = [asyncio.create_task(_complete(http, member.url, f"{i} " + PROMPT))
                 for i in range(3)]
        busy_seen = 0
        deadline = time.monotonic() + 10
        while not all(t.done() for t in tasks) and time.monotonic() < deadline:
            async with http.get(f"{member.url}/slots") as resp:
                slots = await resp.json()
            assert len(slots) == 2
            busy_seen = max(busy_seen, sum(s["is_processing"] for s in slots))
            await asyncio.sleep(0.01)
        results = await asyncio.gather(*tasks)
        assert busy_seen == 2
        assert sorted(r["timings"]["prompt_n"] for r in results) == [201, 201, 201]
