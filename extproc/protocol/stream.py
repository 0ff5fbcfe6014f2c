"""Reading one ext_proc stream: its head, its body, and what follows the decision.

The service (``service.py``) decides; this module only reads what Envoy sends on the stream,
in the shapes its processing modes give: a headers message or a body message carrying the
head in attributes (one-message mode), the body in one message (BUFFERED) or in chunks, the
response phases and trailers a gateway's mode sends after the decision.
"""

from __future__ import annotations

import contextlib

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from ..logs import get_logger
from . import picker
from .request import ATTRIBUTES_KEY, BadRequest, RequestHead, read_attributes, read_head

log = get_logger("extproc.protocol.service")  # its lines kept the service's logger name

# Body modes in which Envoy sends the request body in one message (protocol_config says which)
_WHOLE_BODY = (processing_mode_pb2.ProcessingMode.BUFFERED,
               processing_mode_pb2.ProcessingMode.BUFFERED_PARTIAL)


async def read_opening(context: grpc.aio.ServicerContext, picking: bool
                       ) -> tuple[RequestHead, bool, bytes | None] | None:
    """The request head, whether the message that brought it ends the request, and the
    body that came with it (one-message mode; None after a headers message). None: the
    stream is not a request.

    The message itself stays local here: its protobuf arena is freed on return instead
    of living as long as the (possibly parked) stream.
    """
    first = await context.read()
    if first is grpc.aio.EOF:
        return None
    if first.HasField("request_body"):
        if ATTRIBUTES_KEY not in first.attributes:
            # Headers skipped but no request attributes: an Envoy configured without
            # them. Nothing says what the request is; Envoy's fallback answers it.
            log.warning("request body without headers or request attributes; "
                        "configure the ext_proc filter's request_attributes")
            return None
        body = first.request_body
        opened = read_attributes(first.attributes), body.end_of_stream, body.body
    elif first.HasField("request_headers"):
        headers = first.request_headers
        opened = read_head(headers.headers), headers.end_of_stream, None
    else:
        return None
    opened[0].buffered = first.protocol_config.request_body_mode in _WHOLE_BODY
    if picking:
        head = opened[0]
        head.allowed = picker.subset_hint(first)
        head.duplex_request, head.duplex_response = picker.full_duplex(first)
    return opened


async def read_body(context: grpc.aio.ServicerContext, head: RequestHead, limit: int,
                    picking: bool, first: bytes | None = None,
                    ended: bool = False) -> bytes | None:
    """The whole request body (None if the stream ended first); 413 over the limit.

    ``first`` is the chunk that came with the head in one-message mode, ``ended`` whether
    it was the last. Behind a picker, trailers end the body too (``head.trailers``:
    answered after the decision).
    """
    chunks: list[bytes] = [] if first is None else [first]
    size = len(first or b"")
    # a headers message's end says nothing of a body; a buffered body message is the body
    ended = (ended or head.buffered) and first is not None
    while not ended:
        msg = await context.read()
        if msg is grpc.aio.EOF:
            return None
        if msg.HasField("request_trailers") and picking:
            # a gateway's picker filter sends trailers (none of our own configs do)
            head.trailers = ended = True
            continue
        if not msg.HasField("request_body"):
            continue  # tolerate anything else
        chunk = msg.request_body.body
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        ended = msg.request_body.end_of_stream or head.buffered
    if size > limit:
        raise BadRequest(413, "request_too_large", f"request body is {size} bytes; "
                         f"the limit is {limit}")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def until_closed(context: grpc.aio.ServicerContext,
                       head: RequestHead | None = None) -> None:
    """Keep the stream (the request) open until Envoy ends it, or the server stops (its
    reads then fail: the decision was sent, so the stream is simply over). Response
    phases a gateway's processing mode sends are answered (``picker.follow_up``)."""
    duplex = head is not None and head.duplex_response
    with contextlib.suppress(Exception):  # (grpc raises its private _ServerStoppedError)
        while (message := await context.read()) is not grpc.aio.EOF:
            answer = picker.follow_up(message, duplex)
            if answer is not None:
                await context.write(answer)
