"""The llama.cpp slot client (extproc/platform/kube/idle/slotcache.py) against the simulated
member's slot API (devstack/fakemember_slots.py), through the probe router as in the local stack."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from devstack import procs
from devstack.proberouter import ProbeRouter
from devstack.fakemember import start_upstream
from devstack.fakemember_slots import RESTORE_EFFECT_ENV, SLOT_SAVE_PATH_ENV
from extproc.platform.kube.idle.slotcache import carry, slot_file

PROMPT = " ".join(f"w{i}" for i in range(120))


def test_slot_files_are_named_by_namespace_member_model_and_slot() -> None:
    assert slot_file("ns", "coder", "qwen2.5-coder:7b", 3) == "ns-coder-qwen2.5-coder_7b-slot3.bin"
    assert slot_file(".x", "a/b", "m", 0) == "x-a_b-m-slot0.bin"


async def _served(url: str, prompt: str) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/completions",
                             json={"prompt": prompt, "max_tokens": 1}) as resp:
            return (await resp.json())["timings"]


async def _round_trip(tmp_path: Path, effect: str, monkeypatch: pytest.MonkeyPatch):
    """Save a member's two slots, restart it (the swap), restore: the results and the first
    request's timings."""
    monkeypatch.setenv(SLOT_SAVE_PATH_ENV, str(tmp_path))
    monkeypatch.setenv(RESTORE_EFFECT_ENV, effect)
    port = procs.free_port()
    router = ProbeRouter(procs.free_port(), {"ns/coder": port})
    await router.start()
    slots_url = f"{router.url}/ns/coder/slots"

    def name(slot: int) -> str:
        return slot_file("ns", "coder", "qwen", slot)

    try:
        member = await start_upstream("coder", port=port, token_delay_ms=0, slots=2)
        try:
            await _served(member.url, PROMPT)
            async with aiohttp.ClientSession() as http:
                saved = await carry(http, slots_url, "save", name)
        finally:
            await member.stop()
        member = await start_upstream("coder", port=port, token_delay_ms=0, slots=2)
        try:
            async with aiohttp.ClientSession() as http:
                restored = await carry(http, slots_url, "restore", name)
            first = await _served(member.url, PROMPT + " again")
        finally:
            await member.stop()
    finally:
        await router.stop()
    return saved, restored, first


async def test_save_and_restore_carry_the_cache_across_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved, restored, first = await _round_trip(tmp_path, "full", monkeypatch)
    assert saved.ok and saved.slots == 2 and saved.tokens == 121  # one slot used, one empty
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ns-coder-qwen-slot0.bin", "ns-coder-qwen-slot1.bin"]
    assert restored.ok and restored.tokens == 121 and restored.detail.startswith("2 of 2")
    assert first["cache_n"] == 120 and first["prompt_n"] == 1


async def test_a_restore_llama_cpp_reports_but_does_not_use_shows_in_cache_n(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # sliding-window attention (llama.cpp #25913): n_restored is reported, nothing is reused;
    # the slot client can only see the former, the request's timings show the latter
    saved, restored, first = await _round_trip(tmp_path, "none", monkeypatch)
    assert saved.ok and restored.ok and restored.tokens == 121
    assert first["cache_n"] == 0


async def test_failures_are_reported_not_raised(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SLOT_SAVE_PATH_ENV, raising=False)
    port = procs.free_port()
    member = await start_upstream("coder", port=port, token_delay_ms=0, slots=1)
    try:
        async with aiohttp.ClientSession() as http:
            no_path = await carry(http, f"{member.url}/slots", "save", lambda s: f"x{s}.bin")
            nothing = await carry(http, f"{member.url}/slots", "restore", lambda s: f"x{s}.bin")
            down = await carry(http, f"http://127.0.0.1:{procs.free_port()}/slots", "save",
                               lambda s: f"x{s}.bin")
    finally:
        await member.stop()
    assert not no_path.ok and "501" in no_path.detail and "--slot-save-path" in no_path.detail
    assert not nothing.ok  # a 501 for the restore too: nothing restored
    assert not down.ok and "ClientConnectorError" in down.detail
