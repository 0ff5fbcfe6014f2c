"""One-message streams (request headers skipped): the head comes from the body's attributes.

Speaks ext_proc to the service directly, as Envoy does with the standalone config's
one-message route (what Envoy really sends is pinned in tests/test_envoy_attributes.py).
"""

from __future__ import annotations

import json

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpcprobe import body_message, one_message, open_process, route_of
from relstack import settle, streams_in_flight

from extproc.app import Service

async def _answer(port: int, *messages: bytes) -> ep.ProcessingResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = open_process(channel)
        for message in messages:
            await call.write(message)
        answer = await call.read()
        await call.done_writing()
        await call.read()  # the stream lasts until we end it
        assert await call.code() == grpc.StatusCode.OK
    return answer


async def test_a_one_message_stream_is_routed(service: Service) -> None:
    answer = await _answer(service.grpc_port, one_message(b'{"model": "judge"}'))
    assert route_of(answer) == [("x-modelpool-member", b"judge.demo")]
    assert answer.dynamic_metadata.fields["modelpool"].struct_value.fields[
        "member"].string_value == "judge.demo"
    assert await settle(lambda: streams_in_flight() == 0)


async def test_a_body_in_two_chunks_is_joined(service: Service) -> None:
    answer = await _answer(service.grpc_port, one_message(b'{"model": ', eos=False),
                           body_message(b'"judge"}'))
    assert route_of(answer) == [("x-modelpool-member", b"judge.demo")]


@pytest.mark.parametrize("path, method, headers, status, code", [
    pytest.param("/other", "POST", (), 404, "unknown_path", id="path"),
    pytest.param("/v1/chat/completions", "PUT", (), 405, "method_not_allowed", id="method"),
    pytest.param("/v1/chat/completions", "POST", (("x-modelpool-max-wait", "soon"),), 400,
                 "invalid_max_wait", id="max-wait"),
    pytest.param("/v1/chat/completions", "POST", (("content-encoding", "GZIP"),), 415,
                 "unsupported_content_encoding", id="encoding"),
])
async def test_the_head_comes_from_the_attributes(service: Service, path: str, method: str,
                                                  headers: tuple[tuple[str, str], ...],
                                                  status: int, code: str) -> None:
    answer = await _answer(service.grpc_port, one_message(b'{"model": "judge"}', path, method,
                                                          headers=headers))
    immediate = answer.immediate_response
    assert immediate.status.code == status
    assert json.loads(immediate.body)["error"]["code"] == code
    echoed = {h.header.key: h.header.raw_value for h in immediate.headers.set_headers}
    assert echoed["x-request-id"] == b"rid-one"
