"""Reading an HTTP request as Envoy hands it over: the head, then the model named in the body.

Every way a request can be wrong ends in ``BadRequest`` carrying the HTTP status and the
OpenAI-style error code the client will see.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass

from ..policy.ifidle import parse as parse_activation
from ..settings import parse_duration
from .jsonscan import Scanned, ScanError, scan

# Longest model name accepted; OpenAI and Kubernetes names are far shorter.
MAX_MODEL_LENGTH = 256
# The longest raw model value that can decode to that many characters (each a \uXXXX escape)
_MODEL_BYTES = 6 * MAX_MODEL_LENGTH
# The client's own deadline: how long it is willing to wait for its member (e.g. "20s").
MAX_WAIT_HEADER = "x-modelpool-max-wait"
# Whether the request may start a swap behind a busy incumbent: Wait (yes) or IfIdle (no).
ACTIVATION_HEADER = "x-modelpool-activation"
# Who gets the slot next: the inference extension's objective (the pool maps it to a
# priority), or a priority of ours (an integer) that wins over it.
OBJECTIVE_HEADER = "x-gateway-inference-objective"
PRIORITY_HEADER = "x-modelpool-priority"


class BadRequest(Exception):
    """A request the service refuses, with the status and error code to answer."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers


@dataclass(slots=True)
class RequestHead:
    """The parts of the request headers the service looks at."""

    method: str = ""
    path: str = ""
    content_type: str = ""
    content_encoding: str = ""
    request_id: str = ""
    max_wait: str = ""  # the raw x-modelpool-max-wait value ("" when absent)
    # --endpoint-picker: the proxy's subset hint (None: any endpoint), whether request and
    # response bodies run full duplex, whether the request ended with trailers to answer
    allowed: tuple[str, ...] | None = None
    duplex_request: bool = False
    duplex_response: bool = False
    trailers: bool = False
    # Envoy sends the whole body in one message (BUFFERED): that message ends it, whatever its
    # end_of_stream says (false when trailers follow, which Envoy sends only once answered)
    buffered: bool = False
    # Envoy sends the body STREAMED: it holds each chunk until that chunk is answered
    streamed: bool = False
    content_length: int = -1  # the content-length header (-1: none, as for chunked uploads)
    split: bool = False  # STREAMED, default mode: the body came in more than one message
    activation: str = ""  # the raw x-modelpool-activation value ("" when absent)
    objective: str = ""  # the raw x-gateway-inference-objective value
    priority: str = ""  # the raw x-modelpool-priority value
    # --endpoint-picker: the endpoint we named, and for whom (namespace, pool, member)
    picked: str = ""
    picked_for: tuple[str, str, str] = ("", "", "")


def read_head(header_map: object) -> RequestHead:
    """Pick method, path, content type/encoding and request id out of Envoy's HeaderMap."""
    head = RequestHead()
    for h in header_map.headers:  # type: ignore[attr-defined]
        key = h.key
        if key == ":method":
            head.method = h.raw_value.decode("latin-1")
        elif key == ":path":
            head.path = h.raw_value.decode("latin-1")
        elif key == "content-type":
            head.content_type = h.raw_value.decode("latin-1")
        elif key == "content-encoding":
            head.content_encoding = h.raw_value.decode("latin-1").strip().lower()
        elif key == "x-request-id":
            head.request_id = h.raw_value.decode("latin-1")
        elif key == "content-length":
            value = h.raw_value.decode("latin-1").strip()
            head.content_length = int(value) if value.isdigit() else -1
        elif key == MAX_WAIT_HEADER:
            head.max_wait = h.raw_value.decode("latin-1")
        elif key == ACTIVATION_HEADER:
            head.activation = h.raw_value.decode("latin-1")
        elif key == OBJECTIVE_HEADER:
            head.objective = h.raw_value.decode("latin-1")
        elif key == PRIORITY_HEADER:
            head.priority = h.raw_value.decode("latin-1")
    return head


#: What the one-message mode asks Envoy for (the filter's ``request_attributes``; envoy.yaml
#: lists the same), and the RequestHead field each fills. Envoy evaluates each as a CEL
#: expression; ``request.headers`` alone arrives as an unusable "CelMap value", so each header
#: is named on its own. An absent header arrives as no entry (or null): "".
ATTRIBUTES: dict[str, str] = {
    "request.method": "method",
    "request.path": "path",
    "request.id": "request_id",
    "request.headers['content-type']": "content_type",
    "request.headers['content-encoding']": "content_encoding",
    f"request.headers['{MAX_WAIT_HEADER}']": "max_wait",
    f"request.headers['{ACTIVATION_HEADER}']": "activation",
    f"request.headers['{OBJECTIVE_HEADER}']": "objective",
    f"request.headers['{PRIORITY_HEADER}']": "priority",
}
#: The key Envoy files the request attributes under in ProcessingRequest.attributes.
ATTRIBUTES_KEY = "envoy.filters.http.ext_proc"


def read_attributes(attributes: object) -> RequestHead:
    """The request head from a body message's ``attributes`` (one-message mode)."""
    head = RequestHead()
    struct = attributes.get(ATTRIBUTES_KEY)  # type: ignore[attr-defined]
    if struct is None:
        return head
    for name, value in struct.fields.items():
        field = ATTRIBUTES.get(name)
        if field is not None:
            setattr(head, field, value.string_value)
    head.content_encoding = head.content_encoding.strip().lower()
    return head


def max_wait(head: RequestHead) -> float:
    """Seconds the client will wait for its member (inf without the header), or BadRequest."""
    if not head.max_wait:
        return math.inf
    try:
        return parse_duration(head.max_wait)
    except ValueError:
        raise BadRequest(400, "invalid_max_wait", f"header {MAX_WAIT_HEADER} "
                         f"{head.max_wait[:64]!r} is not a duration (use e.g. 20s, 1m30s, "
                         "500ms)", MAX_WAIT_HEADER) from None


def activation(head: RequestHead) -> str:
    """The activation the client asks for ("" without the header: the pool's), or BadRequest."""
    if not head.activation:
        return ""
    try:
        return parse_activation(head.activation)
    except ValueError as exc:
        raise BadRequest(400, "invalid_activation", f"header {ACTIVATION_HEADER} {exc}",
                         ACTIVATION_HEADER) from None


def priority(head: RequestHead) -> int | None:
    """The priority the client names (None without the header: its objective's), or
    BadRequest."""
    if not head.priority:
        return None
    try:
        return int(head.priority.strip())
    except ValueError:
        raise BadRequest(400, "invalid_priority", f"header {PRIORITY_HEADER} "
                         f"{head.priority[:64]!r} is not an integer", PRIORITY_HEADER) from None


def model_scan(head: RequestHead, body: bytes, max_bytes: int) -> Generator[None, None, str]:
    """The ``model`` the request names (or BadRequest), as a generator that yields now and
    then while a large JSON body is scanned (``jsonscan.run_async`` lets the loop run)."""
    if len(body) > max_bytes:
        raise BadRequest(413, "request_too_large",
                         f"request body is {len(body)} bytes; the limit is {max_bytes}")
    if head.content_encoding not in ("", "identity"):
        raise BadRequest(415, "unsupported_content_encoding",
                         f"content-encoding {head.content_encoding!r} is not supported; "
                         "send an uncompressed body")
    if not body:
        raise BadRequest(400, "missing_body", "request body is empty; it must name a model",
                         "model")
    media_type = head.content_type.split(";", 1)[0].strip().lower()
    if media_type == "multipart/form-data":
        return _check_model(_multipart_model(head.content_type, body))
    if media_type not in ("", "application/json") and not media_type.endswith("+json"):
        raise BadRequest(415, "unsupported_media_type",
                         f"content-type {media_type!r} is not supported; send "
                         "application/json or multipart/form-data")
    try:
        found = yield from scan(body, _MODEL_BYTES)
    except ScanError as exc:
        raise BadRequest(400, "invalid_json", f"request body is not valid JSON: {exc}") \
            from None
    return _json_model(found)


def _json_model(found: Scanned) -> str:
    """The model a scanned JSON body names, or BadRequest."""
    if not found.is_object:
        raise BadRequest(400, "invalid_request", "request body must be a JSON object")
    if not found.model_type:
        raise BadRequest(400, "missing_model", "request body must name a model", "model")
    if found.model_type == "str" and found.model is None:
        raise BadRequest(400, "invalid_model", f"model name is {found.model_length} bytes; "
                         f"at most {MAX_MODEL_LENGTH} characters are allowed", "model")
    if found.model_type != "str":
        raise BadRequest(400, "invalid_model",
                         f"model must be a string, not {found.model_type}", "model")
    return _check_model(found.model)


def body_complete(head: RequestHead, body: bytes) -> Generator[None, None, bool]:
    """Whether ``body`` is a whole document of its type: a JSON object, or a multipart body
    with its closing delimiter (where a STREAMED body's end is known before Envoy says so).
    A generator, as ``model_scan``."""
    tail = body.rstrip(b" \t\r\n")
    if head.content_type.split(";", 1)[0].strip().lower() == "multipart/form-data":
        try:
            return tail.endswith(b"--" + _boundary(head.content_type) + b"--")
        except BadRequest:
            return False
    if not tail.endswith(b"}") or head.content_encoding not in ("", "identity"):
        return False
    try:
        yield from scan(body, 0)
    except ScanError:
        return False
    return True


def _check_model(model: object) -> str:
    if not isinstance(model, str):
        raise BadRequest(400, "invalid_model",
                         f"model must be a string, not {type(model).__name__}", "model")
    if not model:
        raise BadRequest(400, "missing_model", "model must not be empty", "model")
    if len(model) > MAX_MODEL_LENGTH:
        raise BadRequest(400, "invalid_model",
                         f"model name is {len(model)} characters; at most "
                         f"{MAX_MODEL_LENGTH} are allowed", "model")
    if not model.isprintable():
        raise BadRequest(400, "invalid_model", "model name contains control characters",
                         "model")
    return model


def _boundary(content_type: str) -> bytes:
    for param in content_type.split(";")[1:]:
        name, _, value = param.strip().partition("=")
        if name.strip().lower() == "boundary":
            value = value.strip().strip('"')
            if 0 < len(value) <= 70:  # RFC 2046 limit
                return value.encode("latin-1")
    raise BadRequest(400, "invalid_multipart", "multipart/form-data without a valid boundary")


def _multipart_model(content_type: str, body: bytes) -> object:
    """The ``model`` form field of a multipart/form-data body (audio transcription)."""
    delimiter = b"--" + _boundary(content_type)
    if not body.startswith(delimiter) and (b"\r\n" + delimiter) not in body:
        raise BadRequest(400, "invalid_multipart", "multipart body does not contain its "
                         "boundary")
    for part in body.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break  # closing delimiter
        head, sep, content = part.partition(b"\r\n\r\n")
        if not sep:
            raise BadRequest(400, "invalid_multipart", "multipart part without headers")
        if _field_name(head) != "model":
            continue
        if not content.endswith(b"\r\n"):
            raise BadRequest(400, "invalid_multipart", "truncated multipart body")
        try:
            return content[:-2].decode("utf-8").strip()
        except UnicodeDecodeError:
            raise BadRequest(400, "invalid_model", "model field is not UTF-8", "model") \
                from None
    raise BadRequest(400, "missing_model", "multipart body has no model field", "model")


def _field_name(part_head: bytes) -> str:
    """The ``name`` parameter of a multipart part's Content-Disposition header."""
    for line in part_head.split(b"\r\n"):
        header, _, value = line.partition(b":")
        if header.strip().lower() != b"content-disposition":
            continue
        for param in value.split(b";")[1:]:
            key, _, raw = param.strip().partition(b"=")
            if key.strip().lower() == b"name":
                return raw.strip().strip(b'"').decode("latin-1")
    return ""
