"""The data path through the real Envoy: client → Envoy → our ext_proc → the member.

The ext_proc runs in-process with static pools (members judge and coder always reachable),
on its own gRPC server and on grpc.aio (``--grpc-server``), Envoy is the real binary on
loopback, and the members are fake OpenAI-compatible upstreams.
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from multidict import CIMultiDict
import pytest

from devstack.testkit import DEMO_POOLS
from extproc import metrics
from extproc.app import Service
from extproc.settings import Settings

pytestmark = pytest.mark.envoy

POOLS = DEMO_POOLS + "    aliases: {gpt-4o-mini: judge}\n"


@pytest.fixture(params=["native", "grpcio"])
async def stack(request, tmp_path: Path, upstreams, envoy_factory):
    """Our service (on each of its gRPC servers) + Envoy + two fake members; yields
    (envoy, upstreams, service)."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    service = Service(Settings(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0",
                               pools_file=str(pools), max_body_bytes=64 * 1024,
                               grpc_server=request.param))
    await service.start()
    envoy = envoy_factory(service.grpc_port, {f"{name}.demo": handle.port
                                              for name, handle in upstreams.items()})
    try:
        yield envoy, upstreams, service
    finally:
        await service.stop()


async def _post(url: str, body: bytes | dict, headers: dict | None = None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=data, headers={
                "content-type": "application/json", **(headers or {})}) as resp:
            return resp.status, CIMultiDict(resp.headers), await resp.read()


def _error(raw: bytes) -> dict:
    document = json.loads(raw)
    assert set(document["error"]) >= {"message", "type", "code"}
    return document["error"]


async def test_routes_to_the_named_member(stack):
    envoy, upstreams, _ = stack
    for model, member in (("judge", "judge"), ("coder", "coder"), ("gpt-4o-mini", "judge")):
        status, headers, raw = await _post(f"{envoy.url}/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200, raw
        assert headers["x-served-by"] == member
        assert json.loads(raw)["choices"][0]["message"]["content"].startswith(f"[{member}]")


async def test_spoofed_routing_header_is_overwritten(stack):
    envoy, upstreams, _ = stack
    status, headers, _ = await _post(f"{envoy.url}/v1/chat/completions",
                                     {"model": "judge", "messages": []},
                                     {"x-modelpool-member": "coder.demo"})
    assert status == 200
    assert headers["x-served-by"] == "judge"
    assert upstreams["coder"].stats.served == 0


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_request"),
    (b'{"messages": []}', 400, "missing_model"),
    (b'{"model": ""}', 400, "missing_model"),
    (b'{"model": 7}', 400, "invalid_model"),
    (b'{"model": "nope"}', 404, "model_not_found"),
    (b'{"model": "judge", "pad": "' + b"x" * 70_000 + b'"}', 413, "request_too_large"),
])
async def test_bad_requests_get_openai_errors(stack, body, status, code):
    envoy, upstreams, _ = stack
    before = metrics.ERRORS.labels(code, str(status))._value.get()
    got, headers, raw = await _post(f"{envoy.url}/v1/chat/completions", body)
    assert got == status, raw
    assert headers["content-type"] == "application/json"
    assert _error(raw)["code"] == code
    assert metrics.ERRORS.labels(code, str(status))._value.get() == before + 1
    assert upstreams["judge"].stats.served == upstreams["coder"].stats.served == 0


async def test_unknown_model_names_no_other_model(stack):
    envoy, _, _ = stack
    _, _, raw = await _post(f"{envoy.url}/v1/chat/completions", {"model": "gpt-5"})
    message = _error(raw)["message"]
    # the served models are GET /v1/models' to list, not an error's that any client reads
    assert "gpt-5" in message and "/v1/models" in message
    assert "judge" not in message and "coder" not in message


async def test_models_list_is_answered_by_the_ext_proc(stack):
    envoy, upstreams, _ = stack
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{envoy.url}/v1/models") as resp:
            assert resp.status == 200
            document = await resp.json()
        async with session.get(f"{envoy.url}/v1/models/coder") as resp:
            assert resp.status == 200 and (await resp.json())["id"] == "coder"
        async with session.delete(f"{envoy.url}/v1/models") as resp:
            assert resp.status == 405 and resp.headers["allow"] == "GET"
    assert document["object"] == "list"
    assert {m["id"] for m in document["data"]} == {"judge", "coder", "gpt-4o-mini"}
    assert upstreams["judge"].stats.served == 0


async def test_sse_stream_passes_through_untouched(stack):
    envoy, upstreams, _ = stack
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{envoy.url}/v1/chat/completions", json={
                "model": "coder", "stream": True, "max_tokens": 30,
                "messages": [{"role": "user", "content": "count"}]}) as resp:
            assert resp.status == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = [line for line in (await resp.text()).splitlines()
                      if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert len(chunks) >= 30
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_multipart_transcription_is_routed_by_its_model_field(stack):
    envoy, _, _ = stack
    form = aiohttp.FormData()
    form.add_field("file", b"RIFF\0\0\0\0WAVE", filename="a.wav", content_type="audio/wav")
    form.add_field("model", "coder")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{envoy.url}/v1/audio/transcriptions", data=form) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["x-served-by"] == "coder"


@pytest.mark.parametrize("method, path, status, code", [
    ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
    ("POST", "/admin", 404, "unknown_path"),
])
async def test_requests_that_cannot_name_a_model(stack, method, path, status, code):
    envoy, upstreams, _ = stack
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"{envoy.url}{path}", data=b"{}") as resp:
            assert resp.status == status
            assert _error(await resp.read())["code"] == code
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{envoy.url}/v1/chat/completions") as resp:
            assert resp.status == 400
            assert _error(await resp.read())["code"] == "missing_body"
    assert upstreams["judge"].stats.served == 0


@pytest.mark.parametrize("method, path, body, status", [
    ("GET", "/v1/models", None, 200),
    ("GET", "/v1/models/nope", None, 404),
    ("POST", "/v1/chat/completions", b'{"model": "nope"}', 404),
    ("POST", "/v1/chat/completions", b"{not json", 400),
    ("GET", "/v1/chat/completions", None, 405),
])
async def test_answers_of_our_own_carry_envoys_request_id(stack, method, path, body, status):
    # so a client's log line and Envoy's access log (and ours) can be joined on one id
    envoy, _, _ = stack
    before = len(envoy.access_log())
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"{envoy.url}{path}", data=body,
                                   headers={"content-type": "application/json"}) as resp:
            assert resp.status == status
            echoed = resp.headers.get("x-request-id", "")
    assert echoed
    (entry,) = envoy.wait_access_log(before + 1)[before:]
    assert entry["request_id"] == echoed and entry["status"] == status
