"""The fake OpenAI-compatible member: JSON, SSE, multipart answers and its counters."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest

from devstack import procs
from devstack.fakemember import UpstreamHandle, start_upstream
from devstack.fakemember_answers import MAX_TOKENS


async def read_sse(resp: aiohttp.ClientResponse) -> list[str]:
    """The `data:` payloads of an SSE response, in order."""
    events = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            events.append(line[len("data: "):])
    return events


async def test_chat_json(upstreams: dict[str, UpstreamHandle]) -> None:
    judge = upstreams["judge"]
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{judge.url}/v1/chat/completions",
            json={"model": "judge-7b", "messages": [{"role": "user", "content": "hi there"}]},
        ) as resp:
            assert resp.status == 200
            assert resp.headers["x-served-by"] == "judge"
            body = await resp.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "judge-7b"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"].startswith("[judge] you said: hi there")
    assert body["usage"]["completion_tokens"] == len(message["content"].split())
    assert judge.stats.served == 1 and judge.stats.inference == 1 and judge.stats.in_flight == 0


async def test_chat_sse_complete(upstreams: dict[str, UpstreamHandle]) -> None:
    coder = upstreams["coder"]
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{coder.url}/v1/chat/completions",
            json={"model": "coder", "stream": True, "max_tokens": 5,
                  "messages": [{"role": "user", "content": "write code"}]},
        ) as resp:
            assert resp.status == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.headers["x-served-by"] == "coder"
            events = await read_sse(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "coder" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "[coder] you said: write code"  # 5 tokens


async def test_token_count_is_capped() -> None:
    handle = await start_upstream("writer", token_delay_ms=0)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{handle.url}/v1/completions",
                json={"model": "writer", "prompt": "go", "max_tokens": 10_000},
            ) as resp:
                body = await resp.json()
    finally:
        await handle.stop()
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == MAX_TOKENS


async def test_completions_stream_and_embeddings(upstreams: dict[str, UpstreamHandle]) -> None:
    judge = upstreams["judge"]
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{judge.url}/v1/completions",
            json={"model": "judge", "prompt": "a b", "stream": True, "max_tokens": 3},
        ) as resp:
            events = await read_sse(resp)
        async with http.post(
            f"{judge.url}/v1/embeddings", json={"model": "judge", "input": ["x", "y"]}
        ) as resp:
            emb = await resp.json()
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == "[judge] you said:"
    assert [d["index"] for d in emb["data"]] == [0, 1]
    assert len(emb["data"][0]["embedding"]) == 8
    assert emb["data"][0]["embedding"] != emb["data"][1]["embedding"]


async def test_transcription_multipart(upstreams: dict[str, UpstreamHandle]) -> None:
    judge = upstreams["judge"]
    form = aiohttp.FormData()
    form.add_field("model", "judge")
    form.add_field("file", b"\x00" * 1234, filename="clip.wav", content_type="audio/wav")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{judge.url}/v1/audio/transcriptions", data=form) as resp:
            assert resp.status == 200
            assert resp.headers["x-served-by"] == "judge"
            body = await resp.json()
        async with http.post(f"{judge.url}/v1/audio/transcriptions", json={}) as resp:
            assert resp.status == 400
    assert body == {"text": "[judge] transcribed 1234 bytes of clip.wav"}


async def test_bad_json_is_openai_error(upstreams: dict[str, UpstreamHandle]) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{upstreams['judge'].url}/v1/chat/completions", data=b"{nope") as resp:
            assert resp.status == 400
            assert resp.headers["x-served-by"] == "judge"
            body = await resp.json()
    assert "error" in body and body["error"]["type"] == "invalid_request_error"


async def test_probes_slots_and_stats() -> None:
    handle = await start_upstream("judge", token_delay_ms=50)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{handle.url}/health") as resp:
                assert await resp.json() == {"status": "ok"}
            async with http.get(f"{handle.url}/v1/models") as resp:
                assert (await resp.json())["data"][0]["id"] == "judge"
            async with http.get(f"{handle.url}/slots") as resp:
                assert await resp.json() == [{"id": 0, "n_ctx": 65536, "is_processing": False}]

            stream = await http.post(
                f"{handle.url}/v1/chat/completions",
                json={"model": "judge", "stream": True, "max_tokens": 10, "messages": []},
            )
            await stream.content.readline()  # the stream has started
            async with http.get(f"{handle.url}/slots") as resp:
                assert await resp.json() == [{"id": 0, "n_ctx": 65536, "is_processing": True}]
            async with http.get(f"{handle.url}/_upstream/stats") as resp:
                busy = await resp.json()
            await read_sse(stream)
            stream.release()
            async with http.get(f"{handle.url}/_upstream/stats") as resp:
                done = await resp.json()
    finally:
        await handle.stop()
    assert busy["in_flight"] == 1 and busy["name"] == "judge"
    # health, models, slots x2, chat; the stats endpoint itself is not counted
    assert done == {
        "name": "judge", "served": 5, "inference": 2, "in_flight": 0,
        "by_path": {"/health": 1, "/v1/models": 1, "/slots": 2, "/v1/chat/completions": 1},
    }


def test_runs_as_a_process(tmp_path: Path) -> None:
    port = procs.free_port()
    proc = procs.ManagedProcess(
        [sys.executable, "-m", "devstack.fakemember", "--name", "writer", "--port", str(port)],
        tmp_path / "upstream.log",
        cwd=procs.PROJECT_ROOT,
    )
    with proc:
        assert procs.wait_for_http(f"http://127.0.0.1:{port}/health", 15, expect_status=200) == 200
        with pytest.raises(TimeoutError):
            procs.wait_for_http(f"http://127.0.0.1:{port}/nope", 0.3, expect_status=200)
    assert not proc.running
    assert proc.proc is not None and proc.proc.returncode == 0  # clean exit on SIGTERM
    assert "listening" in proc.log_tail()


async def test_client_disconnect_mid_stream_is_accounted() -> None:
    handle = await start_upstream("judge", token_delay_ms=30)
    try:
        async with aiohttp.ClientSession() as http:
            resp = await http.post(
                f"{handle.url}/v1/chat/completions",
                json={"model": "judge", "stream": True, "max_tokens": 100, "messages": []},
            )
            await resp.content.readline()
            resp.close()  # hang up mid-stream
        for _ in range(100):
            if handle.stats.in_flight == 0:
                break
            await asyncio.sleep(0.02)
    finally:
        await handle.stop()
    assert handle.stats.in_flight == 0 and handle.stats.inference == 1
