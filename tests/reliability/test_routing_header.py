"""The routing header cannot be forged: whatever a client sends as ``x-modelpool-member`` (any
case, repeated, listed, in trailers) never picks the member, with the ext_proc up (its value
overwrites) or down (Envoy strips it and answers the 503 fallback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
from rawhttp import RawResponse, build_request, send
from relstack import Stack

from devstack import envoyproc, procs

pytestmark = [pytest.mark.envoy, pytest.mark.asyncio(loop_scope="module")]

JUDGE = b'{"model": "judge", "messages": [{"role": "user", "content": "hi"}]}'

# (request headers, trailers) a client might use to pick the member itself.
FORGERIES = [
    pytest.param([("x-modelpool-member", "coder.demo")], [], id="lowercase"),
    pytest.param([("X-ModelPool-Member", "coder.demo")], [], id="mixed-case"),
    pytest.param([("X-MODELPOOL-MEMBER", "coder.demo")], [], id="upper-case"),
    pytest.param([("x-modelpool-member", "coder.demo"), ("x-modelpool-member", "coder.demo")],
                 [], id="duplicated"),
    pytest.param([("x-modelpool-member", "coder.demo, judge.demo")], [], id="list"),
    pytest.param([("x-modelpool-member", "ghost.demo")], [], id="unknown-cluster"),
    pytest.param([("x_modelpool_member", "coder.demo")], [], id="underscores"),
    pytest.param([], [("x-modelpool-member", "coder.demo")], id="in-trailers"),
    pytest.param([("x-modelpool-member", "coder.demo")], [("x-modelpool-member", "coder.demo")],
                 id="header-and-trailers"),
]


async def _post(port: int, headers: list[tuple[str, str]], trailers: list[tuple[str, str]],
                body: bytes = JUDGE, path: str = "/v1/chat/completions") -> RawResponse:
    framing = "chunked" if trailers else "length"
    return await send(port, build_request(
        "POST", path, body, [("content-type", "application/json"), *headers],
        framing=framing, trailers=tuple(trailers)))


@pytest.mark.parametrize("headers, trailers", FORGERIES)
async def test_forged_header_is_overwritten_when_the_ext_proc_is_up(
        stack: Stack, headers: list[tuple[str, str]], trailers: list[tuple[str, str]]) -> None:
    before = stack.served()
    response = await _post(stack.envoy.listen_port, headers, trailers)
    assert response.status == 200, response.body[:300]
    assert response.headers["x-served-by"] == "judge"
    assert stack.served() == {**before, "judge": before["judge"] + 1}


@pytest.mark.parametrize("headers, trailers", FORGERIES)
async def test_forged_header_cannot_smuggle_a_refused_request(
        stack: Stack, headers: list[tuple[str, str]], trailers: list[tuple[str, str]]) -> None:
    before = stack.served()
    response = await _post(stack.envoy.listen_port, headers, trailers, body=b'{"model": 1}')
    assert response.status == 400
    assert json.loads(response.body)["error"]["code"] == "invalid_model"
    assert stack.served() == before


@pytest.fixture(scope="module")
def envoy_without_extproc(stack: Stack, tmp_path_factory: pytest.TempPathFactory
                          ) -> Iterator[envoyproc.EnvoyProcess]:
    """An Envoy for the same members whose ext_proc port has nothing listening."""
    envoy = envoyproc.EnvoyProcess(procs.free_port(), {f"{n}.demo": h.port
                                                   for n, h in stack.upstreams.items()},
                               workdir=Path(tmp_path_factory.mktemp("envoy-down")))
    envoy.start()
    try:
        yield envoy
    finally:
        envoy.stop()


@pytest.mark.parametrize("headers, trailers", FORGERIES)
async def test_forged_header_is_stripped_when_the_ext_proc_is_down(
        stack: Stack, envoy_without_extproc: envoyproc.EnvoyProcess,
        headers: list[tuple[str, str]], trailers: list[tuple[str, str]]) -> None:
    before = stack.served()
    response = await _post(envoy_without_extproc.listen_port, headers, trailers)
    assert response.status == 503
    assert response.headers["retry-after"] == "5"
    assert json.loads(response.body)["error"]["code"] == "router_unavailable"
    assert stack.served() == before
