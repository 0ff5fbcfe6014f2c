"""Speaking ext_proc to the service directly, as Envoy would, one message at a time."""

from __future__ import annotations

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.protocol.request import ATTRIBUTES_KEY
from extproc.protocol.service import SERVICE

PROCESS = f"/{SERVICE}/Process"


def headers_message(path: str = "/v1/chat/completions", eos: bool = False,
                    extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A request_headers message as Envoy sends it."""
    fields = [(":method", "POST"), (":path", path), ("content-type", "application/json"),
              *extra]
    return ep.ProcessingRequest(request_headers=ep.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                            for k, v in fields]),
        end_of_stream=eos)).SerializeToString()


def body_message(body: bytes) -> bytes:
    """A buffered request_body message."""
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True)) \
        .SerializeToString()


def one_message(body: bytes, path: str = "/v1/chat/completions", method: str = "POST",
                eos: bool = True, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A body message as Envoy sends it with the headers skipped: the head in attributes."""
    msg = ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=eos))
    msg.attributes[ATTRIBUTES_KEY].update({
        "request.method": method, "request.path": path, "request.id": "rid-one",
        "request.headers['content-type']": "application/json",
        **{f"request.headers['{k}']": v for k, v in headers}})
    return msg.SerializeToString()


def open_process(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
    """A raw Process stream: messages in as bytes, ProcessingResponse out."""
    return channel.stream_stream(PROCESS, request_serializer=None,
                                 response_deserializer=ep.ProcessingResponse.FromString)()


async def process_status(port: int) -> grpc.StatusCode:
    """The status a Process stream ends with when it is opened and nothing is written.

    Nothing is written because a server without the method ends the stream at once, and a
    write racing that end fails in the client (INTERNAL) instead of reporting the status.
    """
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return await open_process(channel).code()


async def decide(port: int, body: bytes, extra: tuple[tuple[str, str], ...] = (),
                 credentials: grpc.ChannelCredentials | None = None) -> ep.ProcessingResponse:
    """One request's stream (headers, then body); returns the service's answer to the body."""
    target = f"127.0.0.1:{port}"
    channel = grpc.aio.secure_channel(target, credentials) if credentials \
        else grpc.aio.insecure_channel(target)
    async with channel:
        call = open_process(channel)
        await call.write(headers_message(extra=extra))
        first = await call.read()
        assert first.HasField("request_headers"), first
        await call.write(body_message(body))
        answer = await call.read()
        await call.done_writing()
        await call.read()  # the service keeps the stream until we end it
        assert await call.code() == grpc.StatusCode.OK
    return answer


def route_of(answer: ep.ProcessingResponse) -> list[tuple[str, bytes]]:
    """The headers a body-phase answer sets (the routing header when it routes)."""
    return [(h.header.key, h.header.raw_value)
            for h in answer.request_body.response.header_mutation.set_headers]


async def answers_a_good_request(port: int,
                                 credentials: grpc.ChannelCredentials | None = None) -> bool:
    """One well-formed stream ends in a routing decision for judge."""
    answer = await decide(port, b'{"model": "judge"}', credentials=credentials)
    return route_of(answer) == [("x-modelpool-member", b"judge.demo")]
