"""Reading one ext_proc stream: its head, its body, and what follows the decision.

The service (``service.py``) decides; this module only reads what Envoy sends on the stream,
in the shapes its processing modes give: a headers message or a body message carrying the
head in attributes (one-message mode), the body in one message (BUFFERED) or in chunks, the
response phases and trailers a gateway's mode sends after the decision.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from .. import metrics
from ..logs import Throttled, get_logger
from . import answers, picker
from .jsonscan import run_async
from .request import (ATTRIBUTES_KEY, BadRequest, RequestHead, body_complete, model_scan,
                      read_attributes, read_head)

log = get_logger("extproc.protocol.service")  # its lines kept the service's logger name
_served_elsewhere = Throttled(log, "the gateway served a request elsewhere than picked")

# Body modes in which Envoy sends the request body in one message (protocol_config says which)
_WHOLE_BODY = (processing_mode_pb2.ProcessingMode.BUFFERED,
               processing_mode_pb2.ProcessingMode.BUFFERED_PARTIAL)
_STREAMED = processing_mode_pb2.ProcessingMode.STREAMED
# A STREAMED body is checked for being a whole document only when a chunk ends the way one
# does ("}"), and at most this many times: a body of many such chunks costs a few parses,
# not one per chunk (it then ends where Envoy says: end_of_stream or trailers).
_COMPLETE_CHECKS = 8
_RESPONSE_PHASES = ("response_headers", "response_body", "response_trailers")
_SPLIT_TRAILERS = answers.error(
    400, "streamed_body_with_trailers", "a request body Envoy sends STREAMED in several chunks "
    "cannot be followed by trailers here (Envoy would forward a wrong content-length): send it "
    "without trailers, or configure the ext_proc filter BUFFERED")


class BodyBudget:
    """Request-body bytes the service holds at once (read, not yet decided), and the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def hold(self) -> Hold:
        """A stream's share of the budget, empty to start with."""
        return Hold(self)


class Hold:
    """The body bytes one stream holds; ``release`` (idempotent) gives them back."""

    __slots__ = ("budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.size = 0

    def add(self, size: int) -> None:
        """Count ``size`` more bytes, or 503 (with Retry-After) past the budget."""
        budget = self.budget
        if budget.held + size > budget.limit:
            raise BadRequest(503, "body_budget_exhausted", "the service is reading too many "
                             "request bodies at once; retry", None, (("retry-after", "1"),))
        budget.held += size
        self.size += size

    def release(self) -> None:
        """Give back every byte counted."""
        self.budget.held -= self.size
        self.size = 0


class Silent(Exception):
    """The stream's first message did not come in time."""


async def read_opening(context: grpc.aio.ServicerContext, picking: bool, patience: float
                       ) -> tuple[RequestHead, bool, bytes | None] | None:
    """The request head, whether the message that brought it ends the request, and the
    body that came with it (one-message mode; None after a headers message). None: the
    stream is not a request. ``Silent`` when nothing came within ``patience`` seconds
    (0: no bound): Envoy sends the first message with the stream, so a stream without one
    only holds a connection.

    The message itself stays local here: its protobuf arena is freed on return instead
    of living as long as the (possibly parked) stream.
    """
    try:
        async with asyncio.timeout(patience or None):
            first = await context.read()
    except TimeoutError:
        raise Silent(f"no ProcessingRequest within {patience:g}s of the stream's start") \
            from None
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
    opened[0].streamed = first.protocol_config.request_body_mode == _STREAMED
    if picking:
        head = opened[0]
        head.allowed = picker.subset_hint(first)
        head.duplex_request, head.duplex_response = picker.full_duplex(first)
    return opened


async def read_body(context: grpc.aio.ServicerContext, head: RequestHead, limit: int,
                    picking: bool, hold: Hold, first: bytes | None = None,
                    ended: bool = False) -> bytes | None:
    """The whole request body (None if the stream ended first); 413 over the limit, 503
    past the process's budget of body bytes (``hold`` counts the chunks kept).

    ``first`` is the chunk that came with the head in one-message mode, ``ended`` whether
    it was the last. Behind a picker, trailers end the body too (``head.trailers``:
    answered after the decision).

    STREAMED: Envoy holds each chunk until it is answered, and stops reading the client
    while unanswered data passes its buffer limit, so every chunk but the last is answered
    at once (the decision rides on the last one's answer). The last is the one with
    end_of_stream, or, when trailers follow (Envoy sends them only after every chunk is
    answered, and never with ``request_trailer_mode: SKIP``), the one that completes the
    document (``request.body_complete``).
    """
    chunks: list[bytes] = [] if first is None else [first]
    size = len(first or b"")
    hold.add(size)
    checks = _COMPLETE_CHECKS
    # a headers message's end says nothing of a body; a buffered body message is the body
    ended = (ended or head.buffered) and first is not None
    if head.streamed and first is not None and not ended:
        ended, checks = await _whole(head, chunks, checks)
        if not ended:
            await context.write(answers.CONTINUE_BODY)
    while not ended:
        msg = await context.read()
        if msg is grpc.aio.EOF:
            return None
        if msg.HasField("request_trailers") and (picking or head.streamed):
            # a gateway's picker filter sends trailers (none of our own configs do); in
            # STREAMED mode they come only once every chunk was answered: no body answer is
            # left to carry the decision (only a body that is no document gets here)
            head.trailers = ended = True
            if head.streamed and size <= limit:
                await run_async(model_scan(head, b"".join(chunks), limit))  # no document: its 400
                raise BadRequest(400, "unroutable_body", "the request body's end was not "
                                 "recognised before its trailers: send one JSON object")
            continue
        if msg.WhichOneof("request") in _RESPONSE_PHASES:
            # Envoy answered the request itself (413 for a buffered body over its buffer
            # limit): the response's phases come, each waiting for its answer
            await context.write(picker.follow_up(msg, head.duplex_response) or b"")
            await until_closed(context, head)
            return None
        if not msg.HasField("request_body"):
            continue  # tolerate anything else
        chunk = msg.request_body.body
        size += len(chunk)
        if size <= limit:
            hold.add(len(chunk))
            chunks.append(chunk)
        ended = msg.request_body.end_of_stream or head.buffered
        head.split = head.streamed and not picking and (first is not None or len(chunks) > 1)
        if head.streamed and not ended:
            if size > limit:
                break  # answered at once: the rest need not be read
            ended, checks = await _whole(head, chunks, checks)
            if not ended:
                await context.write(answers.CONTINUE_BODY)
    if size > limit:
        raise BadRequest(413, "request_too_large", f"request body is {size} bytes; "
                         f"the limit is {limit}")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _whole(head: RequestHead, chunks: list[bytes], checks: int) -> tuple[bool, int]:
    """Whether the STREAMED body so far is the whole document, and the checks left."""
    if not checks or not chunks[-1].rstrip(b" \t\r\n").endswith((b"}", b"--")):
        return False, checks
    return await run_async(body_complete(head, b"".join(chunks))), checks - 1


def _check_served(head: RequestHead, message: object) -> None:
    """Endpoint picker: a gateway that reports serving the request elsewhere than we named
    (its retry or fallback configuration moved it) is counted and said, once per 10 s."""
    served = picker.served_elsewhere(message, head.picked)
    if served is None:
        return
    namespace, pool, member = head.picked_for
    metrics.SERVED_ELSEWHERE.labels(namespace, pool).inc()
    _served_elsewhere.warning(namespace=namespace, pool=pool, member=member, picked=head.picked,
                              served=served, request_id=head.request_id)


async def until_closed(context: grpc.aio.ServicerContext,
                       head: RequestHead | None = None) -> None:
    """Keep the stream (the request) open until Envoy ends it, or the server stops (its
    reads then fail: the decision was sent, so the stream is simply over). Response
    phases a gateway's processing mode sends are answered (``picker.follow_up``)."""
    duplex = head is not None and head.duplex_response
    with contextlib.suppress(Exception):  # (grpc raises its private _ServerStoppedError)
        while (message := await context.read()) is not grpc.aio.EOF:
            if head is not None and head.split and message.HasField("request_trailers"):
                # Envoy 1.40 hands a STREAMED body of several chunks with trailers on past
                # envoy/envoy.yaml's buffer filter with twice its content-length: the member
                # would wait for bytes that never come. The trailers pass the ext_proc before
                # the buffer filter lets the request go, so this answer still reaches the client.
                await context.write(_SPLIT_TRAILERS)
                return
            if head is not None and message.HasField("response_headers"):
                _check_served(head, message)
            answer = picker.follow_up(message, duplex)
            if answer is not None:
                await context.write(answer)
