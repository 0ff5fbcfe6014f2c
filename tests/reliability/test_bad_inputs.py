"""The bad-input corpus (bad_inputs.yaml) through the real Envoy: each case gets its 4xx and
error code, no case reaches a member, and the service is still healthy afterwards."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from relstack import SERVING, Stack, health_status, settle, streams_in_flight
from rawhttp import build_request, send

pytestmark = pytest.mark.envoy
MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

CORPUS = Path(__file__).with_name("bad_inputs.yaml")


def render(spec: str | list[Any]) -> bytes:
    """Bytes of a corpus body (or header value): a string or a list of parts."""
    parts = [spec] if isinstance(spec, str) else spec
    return b"".join(_part(p) for p in parts)


def _part(part: Any) -> bytes:
    if isinstance(part, str):
        # surrogatepass: a lone surrogate in the data is meant to reach the wire as-is
        return part.encode("utf-8", "surrogatepass")
    if "repeat" in part:
        return part["repeat"].encode() * part["times"]
    if "hex" in part:
        return bytes.fromhex(part["hex"])
    if "encode" in part:
        text, codec = part["encode"]
        return text.encode(codec)
    if "gzip" in part:
        return gzip.compress(part["gzip"].encode())
    raise ValueError(f"unknown body part {part!r}")


def _load() -> list[Any]:
    document = yaml.safe_load(CORPUS.read_text())
    reasons = document.get("reasons", {})
    params = []
    for case in document["cases"]:
        marks = []
        if "xfail" in case:
            reason = reasons.get(case["xfail"], case["xfail"])
            marks.append(pytest.mark.xfail(strict=True, reason=reason))
        params.append(pytest.param(case, id=case["id"], marks=marks))
    return params


CASES = _load()


def test_corpus_is_large_and_well_formed() -> None:
    ids = [p.id for p in CASES]
    assert len(ids) >= 50 and len(set(ids)) == len(ids)
    for param in CASES:
        case = param.values[0]
        assert 400 <= case["status"] < 500, case["id"]
        render(case.get("body", ""))  # every body spec is renderable


@MODULE_LOOP
@pytest.mark.parametrize("case", CASES)
async def test_bad_input_is_refused_before_any_member(stack: Stack, case: dict[str, Any]) -> None:
    headers = {"content-type": "application/json", **case.get("headers", {})}
    raw = build_request(case.get("method", "POST"), case.get("path", "/v1/chat/completions"),
                        render(case.get("body", "")),
                        [(k, render(v).decode("latin-1")) for k, v in headers.items()],
                        version=case.get("version", "HTTP/1.1"),
                        framing=case.get("framing", "length"))
    before = stack.served()
    response = await send(stack.envoy.listen_port, raw, timeout=20)
    assert response.status == case["status"], response.body[:300]
    if "code" in case:
        assert response.headers["content-type"] == "application/json"
        if case.get("method") != "HEAD":
            error = json.loads(response.body)["error"]
            assert error["code"] == case["code"], error
            assert error["type"] == "invalid_request_error" and error["message"]
    assert stack.served() == before, "a bad request reached a member"


@MODULE_LOOP
async def test_service_is_healthy_after_the_corpus(stack: Stack) -> None:
    assert await health_status(stack.service.grpc_port) == SERVING
    async with aiohttp.ClientSession() as session:
        for model in ("judge", "coder"):
            async with session.post(f"{stack.envoy.url}/v1/chat/completions", json={
                    "model": model, "messages": [{"role": "user", "content": "hi"}]}) as resp:
                assert resp.status == 200
                assert resp.headers["x-served-by"] == model
    # Every stream the corpus opened has been closed and accounted for.
    assert await settle(lambda: streams_in_flight() == 0)
