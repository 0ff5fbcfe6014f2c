"""The ext_proc responses the service sends, serialized once where they never change.

Envoy needs ``raw_value`` bytes in header values (``value`` alone arrives empty), and it
re-picks the route only when the response that clears the route cache also mutates headers,
so the routing answer always carries both.

The routing answer also names the member in dynamic metadata (``METADATA_NAMESPACE``): in
one-message mode (request headers skipped) Envoy drops a body answer's header mutations
("headers aren't available"), so the standalone Envoy routes on that metadata instead. The
same bytes serve both modes.
"""

from __future__ import annotations

import json
from functools import lru_cache

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
#: Dynamic metadata namespace and key of the routing decision (Envoy's
#: ``metadata_options.receiving_namespaces`` and its member routes name the same).
METADATA_NAMESPACE, METADATA_KEY = "modelpool", "member"
#: The metadata key that says a request went to its member's fallback (IfIdle, incumbent
#: busy): the standalone Envoy copies it into the response header ``FALLBACK_HEADER``.
FALLBACK_KEY, FALLBACK_HEADER = "fallback", "x-modelpool-fallback"
#: Metadata keys (and the response headers the standalone Envoy makes of them) that a request
#: released after a hold carries: how long it was held, and the swap it waited for.
HELD_KEY, HELD_HEADER = "held_ms", "x-modelpool-held-ms"
SWAP_KEY, SWAP_HEADER = "swap", "x-modelpool-swap"
#: On our 503s: the predicted seconds until the member serves (Retry-After is its whole,
#: clamped counterpart).
PREDICTED_WAIT_HEADER = "x-modelpool-predicted-wait"

#: Let the request headers pass unchanged (the decision comes with the body).
CONTINUE_HEADERS = ep.ProcessingResponse(
    request_headers=ep.HeadersResponse(response=ep.CommonResponse())).SerializeToString()
#: Let the request body pass unchanged (non-pooled model with passthrough on).
CONTINUE_BODY = ep.ProcessingResponse(
    request_body=ep.BodyResponse(response=ep.CommonResponse())).SerializeToString()

# 429's type is OpenAI's own for a limit on requests (its code there: rate_limit_exceeded)
_ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error",
                405: "invalid_request_error", 413: "invalid_request_error",
                415: "invalid_request_error", 429: "requests", 503: "service_unavailable"}


def header_option(key: str, value: str) -> base_pb2.HeaderValueOption:
    """One header to set, overwriting a value the client sent."""
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1")),
        append_action=_OVERWRITE)


@lru_cache(maxsize=4096)
def route(header: str, value: str, fallback: bool = False) -> bytes:
    """Body-phase answer: set the routing header and make Envoy pick the route again
    (``fallback``: ``value`` is a member's fallback, standing in for a busy incumbent)."""
    return _routed(header, value, {FALLBACK_KEY: fallback_note(value)} if fallback else {})


def released(header: str, value: str, held_for: float, swap: str) -> bytes:
    """``route`` for a request released after a hold: its answer says how long it was held
    and the swap it waited for (not cached: every hold differs)."""
    said = {HELD_KEY: str(round(held_for * 1000))}
    if swap:
        said[SWAP_KEY] = swap
    return _routed(header, value, said)


def _routed(header: str, value: str, said: dict[str, str]) -> bytes:
    common = ep.CommonResponse(header_mutation=ep.HeaderMutation(
        set_headers=[header_option(header, value)]), clear_route_cache=True)
    response = ep.ProcessingResponse(request_body=ep.BodyResponse(response=common))
    response.dynamic_metadata.update({METADATA_NAMESPACE: {METADATA_KEY: value, **said}})
    return response.SerializeToString()


def fallback_note(value: str) -> str:
    """The ``FALLBACK_HEADER`` a response from fallback ``value`` carries (both Envoys)."""
    return f"{value}; reason=pool_incumbent_busy"


def override_timeout(seconds: float) -> bytes:
    """Ask Envoy to wait up to ``seconds`` for our next answer (a parked stream)."""
    response = ep.ProcessingResponse()
    response.override_message_timeout.FromNanoseconds(int(seconds * 1e9))
    return response.SerializeToString()


def error_body(status: int, code: str, message: str, param: str | None = None) -> bytes:
    """An OpenAI-style error document."""
    return json.dumps({"error": {"message": message,
                                 "type": _ERROR_TYPES.get(status, "invalid_request_error"),
                                 "param": param, "code": code}}).encode()


def immediate(status: int, body: bytes, details: str,
              headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """Answer the client directly with a JSON body; Envoy does not route the request."""
    mutation = ep.HeaderMutation(set_headers=[header_option("content-type", "application/json"),
                                              *(header_option(k, v) for k, v in headers)])
    return ep.ProcessingResponse(immediate_response=ep.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), headers=mutation, body=body,
        details=details)).SerializeToString()


def error(status: int, code: str, message: str, param: str | None = None,
          headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """An immediate OpenAI-style error answer; ``details`` shows in Envoy's access log."""
    return immediate(status, error_body(status, code, message, param),
                     f"modelpool_{code}", headers)
