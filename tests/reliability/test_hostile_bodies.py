"""Hostile clients spoken to the service directly, as Envoy would pass them on: a body bomb
(millions of small values around the model), bodies past the process's budget of body bytes
in flight, and streams that never send their first message."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path
from typing import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpcprobe import answers_a_good_request, decide, headers_message, open_process, route_of
from relstack import serving, settle, streams_in_flight

from extproc.app import Service
from extproc.protocol import jsonscan
from extproc.protocol.request import BadRequest, RequestHead, model_scan
from extproc.protocol.jsonscan import run_async

_STREAMED = processing_mode_pb2.ProcessingMode.STREAMED


def model_named(head: RequestHead, body: bytes, max_bytes: int) -> str:
    """The model ``model_scan`` reads from ``body``, scanned to its end at once."""
    return asyncio.run(run_async(model_scan(head, body, max_bytes)))


def bomb(size: int, model_first: bool) -> bytes:
    """A request with ``size`` bytes of empty objects beside its model."""
    values = b"[" + b"{}," * (size // 3) + b"{}]"
    if model_first:
        return b'{"model": "judge", "x": ' + values + b"}"
    return b'{"x": ' + values + b', "model": "judge"}'


@pytest.mark.parametrize("model_first", [True, False], ids=["model-first", "model-last"])
def test_a_body_bomb_costs_about_its_size(model_first: bool) -> None:
    body = bomb(1024 * 1024, model_first)
    tracemalloc.start()
    try:
        assert model_named(RequestHead(), body, len(body)) == "judge"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # json.loads built about 27 times the body; the scanner keeps a bracket stack and slices
    assert peak < 4 * len(body), f"peak {peak} bytes for a body of {len(body)}"


def test_a_large_body_is_read_in_steps() -> None:
    # nested and unlike neighbours: no shortcut, every token is read
    body = b'{"x": [' + b"[0],[1]," * 150_000 + b'[2]], "model": "judge"}'
    scanning = model_scan(RequestHead(), body, len(body))
    steps = 0
    with pytest.raises(StopIteration) as done:
        while True:
            next(scanning)
            steps += 1
    assert done.value.value == "judge"
    assert steps >= 10  # the event loop ran between them


@pytest.mark.parametrize("body, code", [
    (b'{"x": [' + b"{}," * 100_000 + b'{}], "model": "judge"} x', "invalid_json"),
    (b'{"x": [' + b"{}," * 100_000 + b'{},], "model": "judge"}', "invalid_json"),
    (b'{"x": [' + b"{}," * 100_000 + b'{}], "model": 7}', "invalid_model"),
    (b'{"x": [' + b"{}," * 100_000 + b"{}]}", "missing_model"),
    (b"[" + b"{}," * 100_000 + b'{"model": "judge"}]', "invalid_request"),
    (b'{"x": "' + b"a" * 300_000 + b'\x01", "model": "judge"}', "invalid_json"),
    (b'{"x": ' + b"[" * 200_000 + b"]" * 200_000 + b', "model": "judge"}', "invalid_json"),
    (b'{"x": "' + b'\\"' * 200_000 + b'\\q", "model": "judge"}', "invalid_json"),
    (b'{"x": "' + b"\\u0041" * 60_000 + b'\\u004", "model": "judge"}', "invalid_json"),
])
def test_a_large_body_gets_the_answers_of_a_full_parse(body: bytes, code: str) -> None:
    assert len(body) > jsonscan.LOADS_LIMIT
    with pytest.raises(BadRequest) as caught:
        model_named(RequestHead(), body, len(body))
    assert caught.value.code == code


@pytest.mark.parametrize("filler", [b"a" * 300_000, b'\\"\\\\' * 100_000],
                         ids=["plain", "escaped"])
def test_the_last_model_key_wins_in_a_large_body(filler: bytes) -> None:
    body = b'{"model": "coder", "x": "' + filler + b'", "mod\\u0065l": "judge"}'
    assert model_named(RequestHead(), body, len(body)) == "judge"


@pytest_asyncio.fixture(params=["native", "grpcio"])
async def strict(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Service]:
    """The service alone (either gRPC server), with a short first-message bound and a 1 MiB
    body budget."""
    async with serving(tmp_path, first_message_timeout=1.0, max_body_bytes=1024 * 1024,
                       body_bytes_in_flight=1024 * 1024, grpc_server=request.param) as svc:
        yield svc


async def test_silent_streams_are_ended(strict: Service) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{strict.grpc_port}") as channel:
        calls = [open_process(channel) for _ in range(50)]
        codes = await asyncio.wait_for(asyncio.gather(*(c.code() for c in calls)), 30)
    assert set(codes) == {grpc.StatusCode.DEADLINE_EXCEEDED}
    assert await settle(lambda: streams_in_flight() == 0)
    assert await answers_a_good_request(strict.grpc_port)


def _streamed(message: ep.ProcessingRequest) -> bytes:
    message.protocol_config.request_body_mode = _STREAMED
    return message.SerializeToString()


async def test_bodies_past_the_budget_are_answered_503(strict: Service) -> None:
    port = strict.grpc_port
    chunk = b'{"model": "judge", "x": "' + b"a" * 700_000  # no end yet: held
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        holder = open_process(channel)
        await holder.write(_streamed(ep.ProcessingRequest.FromString(headers_message())))
        assert (await holder.read()).HasField("request_headers")
        await holder.write(_streamed(ep.ProcessingRequest(
            request_body=ep.HttpBody(body=chunk, end_of_stream=False))))
        assert (await holder.read()).HasField("request_body")  # CONTINUE: the rest awaited
        answer = await decide(port, b'{"model": "judge", "x": "' + b"b" * 700_000 + b'"}')
        refused = answer.immediate_response
        assert refused.status.code == 503
        assert b'"body_budget_exhausted"' in refused.body
        assert ("retry-after", b"1") in [(h.header.key, h.header.raw_value)
                                         for h in refused.headers.set_headers]
        await holder.write(_streamed(ep.ProcessingRequest(
            request_body=ep.HttpBody(body=b'"}', end_of_stream=True))))
        assert route_of(await holder.read()) == [("x-modelpool-member", b"judge.demo")]
        await holder.done_writing()
    # the held bytes are given back: a large body fits again
    answer = await decide(port, b'{"model": "judge", "x": "' + b"c" * 700_000 + b'"}')
    assert route_of(answer) == [("x-modelpool-member", b"judge.demo")]
