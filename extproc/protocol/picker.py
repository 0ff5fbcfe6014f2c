"""Being an InferencePool's endpoint picker: the Endpoint Picker Protocol's side of a stream.

The Gateway API inference extension (proposal 004, protocol v1.0.0) has the gateway call the
pool's endpoint picker over ext_proc for every request. For a routed request the picker names
one pod, ``podIP:port`` (``[podIP]:port`` for IPv6, the only form Envoy's ORIGINAL_DST cluster
parses: ``platform.hostport``), twice and identically: in the ``x-gateway-destination-endpoint``
request header and under that key in the response's dynamic metadata namespace ``envoy.lb``.
The proxy may restrict the choice with a subset hint (request metadata namespace
``envoy.lb.subset_hint``, key ``x-gateway-destination-endpoint-subset``, a list of
``ip:port`` in the same form); when no allowed endpoint is eligible the answer is 503.

Gateways differ in the body mode they configure (``--endpoint-picker`` serves all three):

* BUFFERED or STREAMED: the body arrives in one or several chunks and passes on by itself;
  the decision rides on the last chunk's answer, as on the EnvoyExtensionPolicy path;
* FULL_DUPLEX_STREAMED (the mode the protocol asks pickers to support): Envoy holds the
  request headers until they are answered and forwards only the body we send back, so the
  decision goes on the headers answer, followed by the whole body as a streamed response;
  response bodies must be echoed chunk by chunk as well.

Envoy says which mode it runs in ``protocol_config`` of the stream's first message.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from ..platform import hostport
from . import answers

#: The header and ``envoy.lb`` metadata key naming the picked endpoint (client values dropped).
DESTINATION = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE, SUBSET_KEY = "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset"
#: The ``envoy.lb`` key under which a gateway reports, on the response, the endpoint that served
SERVED_KEY = "x-gateway-destination-endpoint-served"
_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED

#: The headers answer of a request we do not route (yet): a client's own destination header
#: is removed, so that nothing but our decision can ever pick a pod.
STRIP_HEADERS = ep.ProcessingResponse(request_headers=ep.HeadersResponse(
    response=ep.CommonResponse(header_mutation=ep.HeaderMutation(
        remove_headers=[DESTINATION])))).SerializeToString()
_CONTINUE_RESPONSE_HEADERS = ep.ProcessingResponse(
    response_headers=ep.HeadersResponse(response=ep.CommonResponse())).SerializeToString()
_CONTINUE_RESPONSE_BODY = ep.ProcessingResponse(
    response_body=ep.BodyResponse(response=ep.CommonResponse())).SerializeToString()
#: The answer to request trailers, once the body's (the decision) is sent.
CONTINUE_REQUEST_TRAILERS = ep.ProcessingResponse(
    request_trailers=ep.TrailersResponse()).SerializeToString()
_CONTINUE_RESPONSE_TRAILERS = ep.ProcessingResponse(
    response_trailers=ep.TrailersResponse()).SerializeToString()


def full_duplex(message: ep.ProcessingRequest) -> tuple[bool, bool]:
    """Whether (request, response) bodies run FULL_DUPLEX_STREAMED, per the first message."""
    config = message.protocol_config
    return (config.request_body_mode == _FULL_DUPLEX, config.response_body_mode == _FULL_DUPLEX)


def subset_hint(message: ep.ProcessingRequest) -> tuple[str, ...] | None:
    """The endpoints the proxy allows for this request (None: no hint, any endpoint)."""
    struct = message.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if struct is None or SUBSET_KEY not in struct.fields:
        return None
    value = struct.fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return tuple(_canonical(v.string_value) for v in value.list_value.values
                     if v.string_value)
    if kind == "string_value":  # tolerated: "ip:port,ip:port" as the destination header
        return tuple(_canonical(part.strip()) for part in value.string_value.split(",")
                     if part.strip())
    return ()  # a hint of another shape allows nothing: 503, never a guess


def served_elsewhere(message: ep.ProcessingRequest, picked: str) -> str | None:
    """The endpoint the gateway says served the request, when it is not the one ``picked``
    (None when it is, or when the gateway does not say: the protocol's ``envoy.lb``
    ``x-gateway-destination-endpoint-served`` on the response headers message)."""
    struct = message.metadata_context.filter_metadata.get(LB_NAMESPACE)
    if struct is None or SERVED_KEY not in struct.fields or not picked:
        return None
    served = _canonical(struct.fields[SERVED_KEY].string_value)
    return None if served == picked else served


def _canonical(entry: str) -> str:
    # Picks compare as strings, and an IPv6 address has many spellings ([FD00:0::5]:80 is
    # our [fd00::5]:80); an entry that is no endpoint (a bare v6:port) stays as it is and
    # so allows nothing
    try:
        return hostport.parse(entry)
    except ValueError:
        return entry


class EndpointPicker:
    """Picks a Ready pod of the admitted member, round robin, within the proxy's hint."""

    def __init__(self, endpoints: Callable[[Any, str], Sequence[str]]) -> None:
        self._endpoints = endpoints  # (pool key, member) -> its Ready pods (hostport.join)
        self._turns: dict[tuple[object, str], itertools.count[int]] = {}

    def pick(self, key: object, member: str, allowed: tuple[str, ...] | None) -> str | None:
        """The endpoint for one request to ``member``, or None when none is eligible."""
        ready = self._endpoints(key, member)
        eligible = ready if allowed is None else [e for e in ready if e in allowed]
        if not eligible:
            return None
        turn = self._turns.get((key, member))
        if turn is None:
            turn = self._turns[(key, member)] = itertools.count()
        return eligible[next(turn) % len(eligible)]


def _destination(endpoint: str) -> ep.CommonResponse:
    return ep.CommonResponse(header_mutation=ep.HeaderMutation(
        set_headers=[answers.header_option(DESTINATION, endpoint)]))


def _with_metadata(response: ep.ProcessingResponse, endpoint: str) -> bytes:
    response.dynamic_metadata.update({LB_NAMESPACE: {DESTINATION: endpoint}})
    return response.SerializeToString()


def route_body(endpoint: str) -> bytes:
    """Buffered or streamed body: the decision on the last chunk's answer."""
    return _with_metadata(ep.ProcessingResponse(
        request_body=ep.BodyResponse(response=_destination(endpoint))), endpoint)


def route_headers(endpoint: str) -> bytes:
    """Full duplex: the held headers' answer, with the decision."""
    return _with_metadata(ep.ProcessingResponse(
        request_headers=ep.HeadersResponse(response=_destination(endpoint))), endpoint)


def streamed_body(body: bytes, end: bool, *, request: bool = True) -> bytes:
    """Full duplex: a body chunk handed back for Envoy to forward (it forwards nothing else)."""
    common = ep.CommonResponse(body_mutation=ep.BodyMutation(
        streamed_response=ep.StreamedBodyResponse(body=body, end_of_stream=end)))
    answer = ep.BodyResponse(response=common)
    response = ep.ProcessingResponse(request_body=answer) if request else \
        ep.ProcessingResponse(response_body=answer)
    return response.SerializeToString()


def follow_up(message: ep.ProcessingRequest, duplex_response: bool) -> bytes | None:
    """The answer to a message after the decision (response phases, trailers), or None.

    Envoy only sends what its processing mode asks for, and waits for each answer; the
    EnvoyExtensionPolicy and standalone configs skip these phases, so they never get here.
    """
    if message.observability_mode:
        return None
    kind = message.WhichOneof("request")
    if kind == "request_body":  # STREAMED: a chunk after the one the decision rode on
        return answers.CONTINUE_BODY
    if kind == "response_headers":
        return _CONTINUE_RESPONSE_HEADERS
    if kind == "response_body":
        if duplex_response:
            body = message.response_body
            return streamed_body(body.body, body.end_of_stream, request=False)
        return _CONTINUE_RESPONSE_BODY
    if kind == "request_trailers":
        return CONTINUE_REQUEST_TRAILERS
    if kind == "response_trailers":
        return _CONTINUE_RESPONSE_TRAILERS
    return None

