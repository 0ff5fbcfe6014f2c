"""Request bodies and credentials stay out of the logs: with default settings, even at debug
level, no secret sent in a body or an ``authorization``/``x-api-key`` header shows up in the
service's log or Envoy's logs; ``--log-bodies`` logs bodies, still never the headers."""

from __future__ import annotations

import io
import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from grpcprobe import decide, route_of
from rawhttp import build_request, send
from relstack import POOLS, Stack, settings_for

from extproc.app import Service
from extproc.logs import JsonFormatter

pytestmark = [pytest.mark.envoy, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-live-7f3a9c1e-do-not-log"


@contextmanager
def captured_logs() -> Iterator[io.StringIO]:
    """Everything every logger writes, at debug level, formatted as the service formats it."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield buffer
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _chat(model: str, **extra: object) -> bytes:
    return json.dumps({"model": model, "messages": [
        {"role": "user", "content": f"my password is {SECRET}"}], **extra}).encode()


# (method, path, body) of requests that go every way through the service: routed to the
# resident member, routed after a swap, streamed, refused in each phase.
REQUESTS = [
    ("POST", "/v1/chat/completions", _chat("judge")),
    ("POST", "/v1/chat/completions", _chat("coder")),  # a swap
    ("POST", "/v1/chat/completions", _chat("coder", stream=True)),
    ("POST", "/v1/chat/completions", _chat("ghost")),  # 404 model_not_found
    ("POST", "/v1/chat/completions", b'{"model": "judge", "x": "' + SECRET.encode()),  # bad JSON
    ("POST", "/v1/chat/completions", _chat("judge\n")),  # invalid model
    ("GET", "/v1/chat/completions", b""),  # 405 from the headers alone
    ("POST", "/v1/models", _chat("judge")),
]


async def test_no_secret_in_any_log_by_default(stack: Stack) -> None:
    headers = [("content-type", "application/json"), ("authorization", f"Bearer {SECRET}"),
               ("x-api-key", SECRET), ("cookie", f"session={SECRET}")]
    with captured_logs() as logs:
        statuses = [(await send(stack.envoy.listen_port, build_request(
            method, path, body, headers, framing="length" if body else "none"))).status
            for method, path, body in REQUESTS]
    assert statuses == [200, 200, 200, 404, 400, 400, 405, 405]
    text = logs.getvalue()
    assert "request refused" in text  # the capture saw the service's own lines
    assert SECRET not in text
    stack.envoy.wait_access_log(len(REQUESTS))
    for name in ("access.log", "envoy.log"):
        assert SECRET not in (stack.envoy.workdir / name).read_text()


async def test_no_secret_from_the_query_string_in_the_log(stack: Stack) -> None:
    with captured_logs() as logs:
        response = await send(stack.envoy.listen_port, build_request(
            "POST", f"/v1/chat/completions?api_key={SECRET}", b"{not json",
            [("content-type", "application/json")]))
    assert response.status == 400
    assert "request refused" in logs.getvalue()
    assert SECRET not in logs.getvalue()


@pytest.mark.asyncio(loop_scope="function")
async def test_log_bodies_logs_bodies_but_never_headers(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    service = Service(settings_for(pools, log_bodies=True))
    await service.start()
    try:
        with captured_logs() as logs:
            answer = await decide(service.grpc_port, b'{"model": "judge", "note": "BODY-MARK"}',
                                  extra=(("authorization", f"Bearer {SECRET}"),))
    finally:
        await service.stop()
    assert route_of(answer) == [("x-modelpool-member", b"judge.demo")]
    assert "BODY-MARK" in logs.getvalue()
    assert SECRET not in logs.getvalue()
